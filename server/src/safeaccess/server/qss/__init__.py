"""The server-side half of the query-set auditor: scopes, their locks and state, admission."""
