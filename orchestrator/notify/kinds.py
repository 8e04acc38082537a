"""Which destination kind each watch alert is (the kinds themselves live in orchestrator/alertkinds.py).

The alert rules (orchestrator/watch/alerts.py) say *what* happened; a destination names the kinds it wants in
the user's words: a run that ended is `failed`, `killed`, `lost` or `succeeded` by its state, and the idle-GPU
alert is `gpu_idle_held`.
"""
from __future__ import annotations

from dflash_records.protocol import FAILED, KILLED, LOST, SUCCEEDED

from ..alertkinds import ENDED, GPU_IDLE, GPU_IDLE_HELD, KINDS, NAN, STALL, STARVATION, THROUGHPUT

RECOVERED = "recovered"
# conditions that last and clear (a run recovers from them), as the alert rules name them
CONDITIONS = frozenset({STALL, GPU_IDLE, NAN, THROUGHPUT, STARVATION})


def notify_kind(alert_kind: str, run_state: str | None) -> str | None:
    """The destination kind of a watch alert, or None for an alert no destination can ask for."""
    if alert_kind == ENDED:
        return run_state if run_state in (FAILED, KILLED, LOST, SUCCEEDED) else None
    if alert_kind == GPU_IDLE:
        return GPU_IDLE_HELD
    return alert_kind if alert_kind in KINDS else None
