"""safeaccess output-checking rules: statistical disclosure control checks for released outputs."""
