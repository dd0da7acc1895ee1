"""Auditing a safeaccess centre without seeing its data: the RFC 9162 Merkle log's proofs, signed
checkpoints, the log's record format, and the verifier behind `safeaccess audit verify`."""
