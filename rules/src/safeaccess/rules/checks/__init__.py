"""The check catalogue: one module per output class, each citing the guideline it encodes."""
