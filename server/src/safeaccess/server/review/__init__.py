"""Manual review of withheld outputs: the decisions and their rules."""
