"""The names of the watch's alerts and their severities: a leaf that imports nothing, so that the alert rules,
the trackers, the notification kinds, the inventory's `notify:` validator and the dashboard share these strings
without importing the alert engine (which once closed a circle of 14 modules through the inventory)."""
from __future__ import annotations

INFO, WARNING, ERROR = "info", "warning", "error"

# what happened to a run (the alert rules say which); a run that ended is told by its state as well
EXCEPTION, ENDED, STALL, GPU_IDLE, THROUGHPUT, NAN, STARVATION = (
    "exception", "ended", "stall", "gpu_idle", "throughput", "nan", "starvation")
RESTARTED = "restarted"  # the supervisor started a run again under its restart policy (a failed or hung attempt)
LOG_RESET = "log_reset"  # the followed log was truncated or replaced: the run's view starts over
LOW_DISK = "low_disk"    # a target's alert: its runs directory is running out of room
