"""The names of the watch's alerts, their severities and the kinds a notification destination may ask for: a leaf
(it reads only the run states of the agent's protocol), so that the alert rules, the trackers, the notifiers, the
inventory's `notify:` validator and the dashboard share these strings without importing the alert engine (which
once closed a circle of 14 modules through the inventory) or the notify package (which reads the inventory).

A destination names the kinds it wants in the user's words: a run that ended is `failed`, `killed`, `lost` or
`succeeded` by its state, and the idle-GPU alert is `gpu_idle_held` (notify/kinds.py maps alerts to them).
"""
from __future__ import annotations

import difflib

from dflash_records.protocol import FAILED, KILLED, LOST, SUCCEEDED

INFO, WARNING, ERROR = "info", "warning", "error"

# what happened to a run (the alert rules say which); a run that ended is told by its state as well
EXCEPTION, ENDED, STALL, GPU_IDLE, THROUGHPUT, NAN, STARVATION = (
    "exception", "ended", "stall", "gpu_idle", "throughput", "nan", "starvation")
RESTARTED = "restarted"  # the supervisor started a run again under its restart policy (a failed or hung attempt)
LOG_RESET = "log_reset"  # the followed log was truncated or replaced: the run's view starts over
LOW_DISK = "low_disk"    # a target's alert: its runs directory is running out of room
QUEUE_DRAINED = "queue_drained"  # a target's queue emptied by a start, or a sweep's runs all ended (no run id)

# what a notification destination may ask for (the inventory's `notify: kinds`), and what it gets by default
GPU_IDLE_HELD = "gpu_idle_held"
KINDS = (FAILED, KILLED, LOST, SUCCEEDED, RESTARTED, EXCEPTION, STALL, GPU_IDLE_HELD, NAN, THROUGHPUT, STARVATION,
         QUEUE_DRAINED)
DEFAULT_KINDS = (FAILED, KILLED, LOST, RESTARTED, EXCEPTION, STALL, GPU_IDLE_HELD, NAN, QUEUE_DRAINED)
DEFAULT_REPEAT_S = 600.0  # at most one notification per kind and run in this window


def check_kind(value: str) -> str:
    """A kind named in the inventory; a ValueError names the close match and every kind otherwise."""
    if value in KINDS:
        return value
    close = difflib.get_close_matches(str(value), KINDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown alert kind {value!r}{hint}; kinds: {', '.join(KINDS)}")
