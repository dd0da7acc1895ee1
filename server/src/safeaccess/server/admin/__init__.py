"""The controller's command line, one module per command group (`db.py`: schema migrations)."""
