"""When a queue drains (`queue_drained`): a target's queue that emptied because its last queued run started, and
a sweep whose runs have all ended. Pure: fed with run records as the watch receives them, no IO, no clock.

Only what changes while the watch looks is news: a target first seen with no queued run, or a sweep first seen
with every run ended, says nothing. A queue emptied by `kill` alone (no run started) has not drained: it was
emptied by hand.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from dflash_records.protocol import KILLED, QUEUED, TERMINAL_STATES, iso_utc
from dflash_records.run import RunRecord

from ..alertkinds import INFO, QUEUE_DRAINED
from .model import AlertView


class QueueDrain:
    def __init__(self) -> None:
        self._queued: dict[str, set[str]] = {}     # target -> its runs queued at the last look
        self._sweeps: dict[str, bool] = {}         # sweep id -> whether every run of it had ended at the last look

    def observe_target(self, target: str, runs: Iterable[RunRecord], now: float) -> list[AlertView]:
        """A target's runs as its agent listed them: the alert when its queue emptied by a start."""
        runs = list(runs)
        queued = {run.run_id for run in runs if run.state == QUEUED}
        before, self._queued[target] = self._queued.get(target), queued
        if not before or queued:
            return []
        started = [run for run in runs if run.run_id in before and run.state != KILLED]
        if not started:
            return []
        last = max(started, key=lambda run: run.started_at or run.created_at or "")
        return [AlertView(time=iso_utc(now, timespec="seconds"), run_id=None, target=target, kind=QUEUE_DRAINED,
                          severity=INFO, message=f"queue of {target} drained: {last.run_id} started, no run is left "
                                                 f"queued")]

    def observe_sweeps(self, runs: Iterable[tuple[str, RunRecord]], now: float) -> list[AlertView]:
        """Every watched run (target, record): an alert for each sweep whose runs have all ended since the last
        look."""
        members: dict[str, list[RunRecord]] = {}
        for _, run in runs:
            if run.sweep_id:
                members.setdefault(run.sweep_id, []).append(run)
        alerts = []
        for sweep_id, records in members.items():
            ended = all(run.state in TERMINAL_STATES for run in records)
            if ended and self._sweeps.get(sweep_id) is False:
                counts = Counter(run.state for run in records)
                said = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
                alerts.append(AlertView(time=iso_utc(now, timespec="seconds"), run_id=None, target=None,
                                        kind=QUEUE_DRAINED, severity=INFO, sweep_id=sweep_id,
                                        message=f"sweep {sweep_id} drained: all {len(records)} runs ended "
                                                f"({said}); `dflashctl sweep report {sweep_id}` ranks them"))
            self._sweeps[sweep_id] = ended
        return alerts


__all__ = ["QueueDrain"]
