"""Computation of each analysis kind, one module per output class.

Every compute function has the signature `(analysis, frame, metadata, n_records) -> Output`, where
`frame` is the filtered data whose index holds the stored record positions.
"""
