"""safeaccess controller service: HTTP API, store, step pipeline, admin CLI and demo."""
