"""The audit log (an RFC 9162 Merkle tree) and the records it holds."""
