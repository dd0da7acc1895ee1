"""safeaccess sandbox: isolated execution backends and the analysis runner."""
