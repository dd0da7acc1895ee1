"""The end-to-end demo (`safeaccess-server demo`) and its made-up data."""
