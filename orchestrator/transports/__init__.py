"""How commands reach a target: one interface (base.py) over local subprocesses, SSH and `pct exec`, a mock for
tests, one shared connection per host (pool.py), and every host asked in parallel (fanout.py)."""
