"""The job queue (execution = "queue"): API replicas defer each step as a procrastinate job in
PostgreSQL; `safeaccess-server worker` hosts claim and run them (`tasks.py`, `worker.py`), and
expired leases are settled by `leases.py`."""
