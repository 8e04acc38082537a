"""A job node's worker restarts, as attempts of its run.

torchrun restarts the workers of every node of a job itself (`--max-restarts`), with no supervisor involved, and
numbers each start in the workers' environment (TORCHELASTIC_RESTART_COUNT). The node's supervisor reads that
number; each restart closes the run's current attempt and opens the next, so `ps` and `watch` show
`running (attempt 2/4)`, a watch alerts each restart, and the crash-loop guard sees a job that repeats one
failure without progress (dflash_records.restart.crash_loop) and ends it rather than letting torchrun spend
every restart.
"""
from __future__ import annotations

from dflash_records.protocol import ascii_decimal
from dflash_records.restart import RESTART_COUNT_ENV

from . import procfs

WORKERS_RESTARTED = "workers restarted"  # an attempt's reason: its workers failed and torchrun started new ones


def restart_count(pids) -> int | None:
    """The highest restart number in the environments of these processes; None when none carries one."""
    counts = [ascii_decimal((procfs.read_environ(pid) or {}).get(RESTART_COUNT_ENV)) for pid in pids]
    return max((count for count in counts if count is not None), default=None)


def max_attempts(run: dict) -> int | None:
    """A job node's attempts (its first start and torchrun's restarts of its workers); None for a plain run."""
    restarts = run.get("worker_restarts")
    return 1 + int(restarts) if run.get("job_id") and isinstance(restarts, int) and restarts > 0 else None
