"""Rehearsal on a mock dataset drawn from published metadata alone.

It runs the runner's compute code outside any sandbox (there is nothing confidential in a mock),
so it lives beside the runner, not in it: `data.py` draws the mock, `rehearsal.py` runs a plan.
"""
