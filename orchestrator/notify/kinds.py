"""The alert kinds a notification destination can ask for, and which kind each watch alert is.

The alert rules (orchestrator/watch/alerts.py) say *what* happened; a destination names the kinds it wants in
the user's words: a run that ended is `failed`, `killed`, `lost` or `succeeded` by its state, and the idle-GPU
alert is `gpu_idle_held`.
"""
from __future__ import annotations

import difflib

from ..agent.protocol import FAILED, KILLED, LOST, SUCCEEDED
from ..watch.alertkinds import ENDED, EXCEPTION, GPU_IDLE, NAN, RESTARTED, STALL, STARVATION, THROUGHPUT

GPU_IDLE_HELD = "gpu_idle_held"
RECOVERED = "recovered"
# conditions that last and clear (a run recovers from them), as the alert rules name them
CONDITIONS = frozenset({STALL, GPU_IDLE, NAN, THROUGHPUT, STARVATION})
KINDS = (FAILED, KILLED, LOST, SUCCEEDED, RESTARTED, EXCEPTION, STALL, GPU_IDLE_HELD, NAN, THROUGHPUT, STARVATION)
DEFAULT_KINDS = (FAILED, KILLED, LOST, RESTARTED, EXCEPTION, STALL, GPU_IDLE_HELD, NAN)
DEFAULT_REPEAT_S = 600.0  # at most one notification per kind and run in this window


def notify_kind(alert_kind: str, run_state: str | None) -> str | None:
    """The destination kind of a watch alert, or None for an alert no destination can ask for."""
    if alert_kind == ENDED:
        return run_state if run_state in (FAILED, KILLED, LOST, SUCCEEDED) else None
    if alert_kind == GPU_IDLE:
        return GPU_IDLE_HELD
    return alert_kind if alert_kind in KINDS else None


def check_kind(value: str) -> str:
    """A kind named in the inventory; a ValueError names the close match and every kind otherwise."""
    if value in KINDS:
        return value
    close = difflib.get_close_matches(str(value), KINDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown alert kind {value!r}{hint}; kinds: {', '.join(KINDS)}")
