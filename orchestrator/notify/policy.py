"""Which alerts become notifications, and when. Pure: no IO, no clock (callers pass `now`).

Each destination gets the kinds it asked for, of what happens while the watch runs (not what a log already held
when it began). Repeats are collapsed: one kind of one run reaches a destination
at most once per its window (the next one that is sent says how many were held back). A run whose notified
conditions (a stall, idle GPUs, a NaN loss...) have all cleared, while it still lives, sends one "recovered"
line to each destination that was told about them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash_records.protocol import TERMINAL_STATES

from ..alertkinds import GPU_IDLE_HELD, QUEUE_DRAINED
from ..display import step_figures
from ..watch.model import AlertFeed, AlertView, RunStatus
from .destinations import Destination
from .kinds import CONDITIONS, RECOVERED, notify_kind

TITLE_PREFIX = "dflashctl"


@dataclass(frozen=True)
class Outgoing:
    """One message for one destination."""

    destination: Destination
    kind: str        # the destination kind (failed, stall, gpu_idle_held...) or `recovered`
    severity: str    # info / warning / error, or `recovered`
    title: str
    body: str
    run_id: str | None
    target: str | None


class NotifyPolicy:
    def __init__(self, destinations: Sequence[Destination]) -> None:
        self.destinations = list(destinations)
        self._last_sent: dict[tuple[int, str, str], float] = {}  # (destination, run, kind) -> when
        self._held: dict[tuple[int, str, str], int] = {}  # repeats collapsed since the last one sent
        self._open: dict[tuple[int, str], set[str]] = {}  # conditions a destination was told of, not cleared

    def observe(self, feed: AlertFeed, now: float) -> list[Outgoing]:
        """The messages the feed's new alerts and the runs' present conditions call for."""
        out: list[Outgoing] = []
        for alert, old in feed.flagged():
            if old:  # old news: what a log held when the watch began
                continue
            if alert.run_id is not None:
                out += self._on_alert(alert, feed.runs.get(alert.run_id), now)
            elif alert.kind == QUEUE_DRAINED:
                out += _drained(self.destinations, alert)
        return out + self._recoveries(feed.runs)

    def _on_alert(self, alert: AlertView, run: RunStatus | None, now: float) -> list[Outgoing]:
        kind = notify_kind(alert.kind, run.state if run else None)
        if kind is None:
            return []
        out = []
        for index, destination in enumerate(self.destinations):
            if kind not in destination.kinds:
                continue
            key = (index, str(alert.run_id), kind)
            last = self._last_sent.get(key)
            if last is not None and now - last < destination.repeat_s:
                self._held[key] = self._held.get(key, 0) + 1
                continue
            self._last_sent[key] = now
            held = self._held.pop(key, 0)
            if alert.kind in CONDITIONS:
                self._open.setdefault((index, str(alert.run_id)), set()).add(alert.kind)
            out.append(_message(destination, kind, alert, run, held))
        return out

    def _recoveries(self, runs: dict[str, RunStatus]) -> list[Outgoing]:
        out = []
        for (index, run_id), kinds in list(self._open.items()):
            run = runs.get(run_id)
            if run is None or run.state in TERMINAL_STATES:  # gone, or ended: its end was the news
                del self._open[(index, run_id)]
                continue
            kinds &= run.conditions  # those still raised
            if not kinds:
                del self._open[(index, run_id)]
                out.append(_recovered(self.destinations[index], run))
        return out


def _message(destination: Destination, kind: str, alert: AlertView, run: RunStatus | None, held: int) -> Outgoing:
    # a message may begin with its kind already (`restarted: attempt 2/5 ...`, as the dashboard shows it)
    said = alert.message if alert.message.startswith(f"{kind}: ") else f"{kind}: {alert.message}"
    lines = [said]
    if held:
        lines.append(f"({held} more {kind} alert{'s' if held > 1 else ''} of this run since the last "
                     "notification were collapsed)")
    lines += _run_lines(alert.run_id or "", alert.target, run)
    return Outgoing(destination, kind, alert.severity, _title(alert.run_id or "", alert.target, run, kind),
                    "\n".join(lines), alert.run_id, alert.target)


def _drained(destinations: Sequence[Destination], alert: AlertView) -> list[Outgoing]:
    """A queue that drained (a target's, a sweep's): each time it happens, never collapsed (it is rare news)."""
    who = f"sweep {alert.sweep_id}" if alert.sweep_id else alert.target or "?"
    return [Outgoing(destination, QUEUE_DRAINED, alert.severity, f"{TITLE_PREFIX}: {who}: queue drained",
                     alert.message, None, alert.target) for destination in destinations
            if QUEUE_DRAINED in destination.kinds]


def _recovered(destination: Destination, run: RunStatus) -> Outgoing:
    lines = ["recovered: the run is healthy again"] + _run_lines(run.run_id, run.target, run)
    return Outgoing(destination, RECOVERED, RECOVERED, _title(run.run_id, run.target, run, RECOVERED),
                    "\n".join(lines), run.run_id, run.target)


def _title(run_id: str, target: str | None, run: RunStatus | None, kind: str) -> str:
    who = run.name if run and run.name else run_id
    return f"{TITLE_PREFIX}: {who} on {target or '?'}: {kind.replace(GPU_IDLE_HELD, 'GPUs idle, memory held')}"


def _run_lines(run_id: str, target: str | None, run: RunStatus | None) -> list[str]:
    named = f" ({run.name})" if run and run.name else ""
    state = f", {run.state}" if run else ""
    # the step's figures from its record (metrics.jsonl's where it exists), as every view shows them
    last = step_figures(run.last_step) if run and run.last_step else (run.last_step_line if run else None)
    last = last or "none yet"
    return [f"run {run_id}{named} on {target or '?'}{state}", f"last step: {last}"]

