"""The dashboard's live data source: one watch stream per container over one SSH connection per host.

Each stream's thread feeds what its agent sends (run records, log bytes from byte offsets, GPU samples) into
per-run trackers (parser + health) under one lock; `snapshot()` only assembles views the trackers cached. A
lost host shows as disconnected with its retry countdown while the other hosts keep updating, and on
reconnect every log resumes from the byte where its parser stopped.
"""
from __future__ import annotations

import base64
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from dflash_records.answers import LinesAnswer
from dflash_records.protocol import TERMINAL_STATES, iso_utc
from dflash_records.run import RunRecord
from dflash_records.watchwire import (DiskMessage, GpuMessage, LogMessage, MetricsMessage, ResetMessage, RunsMessage,
                                      SyncedMessage, WatchMessage)

from ..errors import DflashError, TargetNotFound
from ..inventory.model import Inventory, Target
from ..runs.client import RunClient
from ..transports.pool import Connections
from .alerts import Alert, AlertRules, DiskHealth
from .drain import QueueDrain
from .jobrows import fold_jobs
from .model import ActionResult, AlertFeed, AlertView, HostView, RunView, Snapshot
from .stream import ContainerStream, StreamOptions
from .sweeprows import group_sweeps
from .trackers import GpuTracker, RunTracker, alert_view

MAX_ALERTS = 500
LINE_COUNT_CACHE_S = 1.0
CLOSE_WAIT_S = 5.0  # how long closing waits for the streams' threads to end their commands
COUNTDOWN_TICK_S = 1.0  # how often a retry countdown the dashboard shows moves on


@dataclass
class TargetState:
    """One container as the source sees it."""

    target: Target
    runs: dict[str, RunTracker] = field(default_factory=dict)
    gpus: GpuTracker | None = None
    disk: DiskHealth | None = None   # free space where its runs are written
    connected: bool = False
    error: str | None = None
    retry_at: float | None = None
    reconnecting: bool = False
    got_runs: bool = False
    got_gpus: bool = False
    failed_once: bool = False

    @property
    def answered(self) -> bool:
        """Answered once (runs, their logs up to date, a GPU sample or error), or failed trying."""
        if self.failed_once:
            return True
        return self.got_runs and self.got_gpus and all(t.synced for t in self.runs.values())


class LiveSource:
    def __init__(self, inventory: Inventory, targets: list[Target], *, gpu_interval: float = 1.0,
                 history: int = 2000, log_tail: int = 200, gpu_history: int = 120, heartbeat_s: float = 5.0,
                 conns: Connections | None = None, rules: AlertRules | None = None,
                 first_look: int | None = None) -> None:
        """`first_look`: bytes of each run's log (and metrics.jsonl) end a first look reads; None, the agent's
        default (256 KiB of log: the dashboard's history). A one-shot snapshot asks for less."""
        self.inventory = inventory
        self.conns = conns or Connections()
        self._own_conns = conns is None
        self.client = RunClient(inventory, self.conns)
        self._history, self._tail = history, log_tail
        self._first_look: dict[str, int] = {"offset": -1, **({"tail": first_look} if first_look else {})}
        self._rules = rules
        self._alert_total = 0  # alerts ever added: the alert feed's cursor
        self._lock = threading.Condition(threading.RLock())
        self._version = self._seen_version = 0
        self._alerts: deque[AlertView] = deque(maxlen=MAX_ALERTS)
        self._alert_backlog: deque[bool] = deque(maxlen=MAX_ALERTS)  # per alert: found in a log's old content
        self._targets = {t.name: TargetState(t, gpus=GpuTracker(t.name, history=gpu_history),
                                             disk=DiskHealth(t.name, rules=rules)) for t in targets}
        self._line_counts: dict[str, tuple[float, int]] = {}
        self._jobs: dict[str, list[RunView]] = {}  # job id -> its node runs, as of the last snapshot
        self._drain = QueueDrain()  # queue_drained: a target's queue emptied by a start, a sweep's runs all ended
        options = StreamOptions(gpu_interval=gpu_interval, heartbeat_s=heartbeat_s)
        self._streams = {t.name: ContainerStream(t, self.client, self, options) for t in targets}
        for stream in self._streams.values():
            stream.start()

    # -- DashboardSource ------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._seen_version = self._version
            states = list(self._targets.values())
            runs, self._jobs = fold_jobs([(t.run, t.diagnosed_view(s.gpus.views()))
                                          for s in states for t in s.runs.values()])
            gpus = tuple(g for s in states for g in s.gpus.views())
            return Snapshot(taken_at=iso_utc(timespec="seconds"), runs=tuple(group_sweeps(runs)), gpus=gpus,
                            hosts=self._host_views(),
                            alerts=tuple(self._alerts),
                            gpu_errors={s.target.name: s.gpus.error for s in states if s.gpus.error})

    def wait_for_change(self, timeout: float) -> bool:
        """True once something changed; a host's retry countdown counts as a change every second."""
        with self._lock:
            counting = any(s.retry_at is not None for s in self._targets.values())
            changed = self._lock.wait_for(lambda: self._version != self._seen_version,
                                          min(timeout, COUNTDOWN_TICK_S) if counting else timeout)
            return changed or counting

    @property
    def targets(self) -> list[Target]:
        return [state.target for state in self._targets.values()]

    def alert_feed(self, cursor: int, *, after_version: int | None = None, timeout: float = 0.0) -> AlertFeed:
        """The alerts added since `cursor` (0: every alert still kept), with each run's status and the hosts.
        With `after_version`, waits up to `timeout` for a change after it first. Unlike `snapshot()` it leaves
        the dashboard's change tracking alone, so a notifier can read it beside the dashboard."""
        with self._lock:
            if after_version is not None:
                self._lock.wait_for(lambda: self._version != after_version, timeout)
            new = min(self._alert_total - cursor, len(self._alerts))
            alerts = tuple(self._alerts)[len(self._alerts) - new:] if new > 0 else ()
            backlog = tuple(self._alert_backlog)[len(self._alert_backlog) - new:] if new > 0 else ()
            runs = {run_id: t.status() for s in self._targets.values() for run_id, t in s.runs.items()}
            return AlertFeed(cursor=self._alert_total, version=self._version, alerts=alerts, backlog=backlog,
                             runs=runs, hosts=self._host_views())

    def note(self, note: AlertView) -> None:
        """An alert of the watch itself (a notification that could not be sent): shown like the others."""
        with self._lock:
            self._alerts.append(note)
            self._alert_backlog.append(False)
            self._alert_total += 1
            self._changed()

    def wait_until_answered(self, timeout: float) -> bool:
        """Block until every target has answered once or failed; False if the timeout came first."""
        return self.wait_while_answering(timeout, cap_s=timeout)

    def wait_while_answering(self, quiet_s: float, *, cap_s: float) -> bool:
        """Block until every target has answered once or failed, as long as targets keep answering: False once
        `quiet_s` passed with no target answering (since the start or the last one that did), or `cap_s` in
        all. A slow fleet that keeps answering is waited for; a silent target alone is given up on."""
        started = last = time.monotonic()
        done = 0
        with self._lock:
            while True:
                answered = sum(s.answered for s in self._targets.values())
                if answered == len(self._targets):
                    return True
                now = time.monotonic()
                if answered > done:
                    done, last = answered, now
                left = min(last + quiet_s, started + cap_s) - now
                if left <= 0:
                    return False
                self._lock.wait(min(left, 1.0))

    def settle(self) -> None:
        """Have every parser emit what it holds for a quiet stream (a traceback that ends the log), as the live
        loop's ticks do: a one-shot snapshot taken before the first tick must show it too."""
        for state in list(self._targets.values()):
            self.tick(state.target)

    def unreachable(self, *, waited_s: float | None = None) -> dict[str, str]:
        """Targets not connected now, with the reason (one that never answered: how long it was waited for)."""
        silent = "not connected" if waited_s is None else f"no answer within {waited_s:.0f}s"
        with self._lock:
            return {name: s.error or silent for name, s in self._targets.items() if not s.connected}

    def kill(self, run_id: str, *, grace: float) -> ActionResult:
        nodes = self._jobs.get(run_id)
        if nodes:  # a job's row: stop every node
            results = [self.kill(node.run_id, grace=grace) for node in nodes]
            ok = all(r.ok for r in results)
            return ActionResult(ok=ok, message=f"{run_id}: " + "; ".join(r.message for r in results))
        try:
            target = self._target_of(run_id)
            answer = self.client.kill(target, [run_id], grace=grace)
        except DflashError as exc:
            return ActionResult(ok=False, message=str(exc))
        state = answer.runs[0].state if answer.runs else None
        message = f"{run_id} is {state}" if answer.ok else answer.error or f"{run_id}: not all gone"
        return ActionResult(ok=answer.ok, message=message)

    def cleanup(self, target: str, *, dry_run: bool) -> ActionResult:
        state = self._targets.get(target)
        if state is None:
            return ActionResult(ok=False, message=f"{target} is not watched")
        try:
            answer = self.client.cleanup(state.target, dry_run=dry_run)
        except DflashError as exc:
            return ActionResult(ok=False, message=str(exc))
        return ActionResult(ok=answer.ok, message=answer.summary(target), cleanup=answer)

    def log_line_count(self, run_id: str) -> int:
        cached = self._line_counts.get(run_id)
        if cached is not None and time.monotonic() - cached[0] < LINE_COUNT_CACHE_S:
            return cached[1]
        return self._lines(run_id, 0, 0).total

    def log_lines(self, run_id: str, start: int, stop: int) -> list[str]:
        return list(self._lines(run_id, start, stop).lines)

    def close(self) -> None:
        for stream in self._streams.values():
            stream.stop()
        deadline = time.monotonic() + CLOSE_WAIT_S  # one wait for them all: they end in parallel
        for stream in self._streams.values():
            stream.join(max(0.0, deadline - time.monotonic()))
        if self._own_conns:
            self.conns.close()

    def __enter__(self) -> "LiveSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- StreamSink (called from the stream threads) ---------------------------------------------------------

    def connected(self, target: Target) -> dict[str, object]:
        with self._lock:
            state = self._targets[target.name]
            for tracker in state.runs.values():
                tracker.synced = False
            return {run_id: _resume_point(t, self._first_look) for run_id, t in state.runs.items()}

    def message(self, target: Target, message: WatchMessage) -> dict[str, object] | None:
        now = time.time()
        with self._lock:
            state = self._targets[target.name]
            if not state.connected:  # connected once the agent speaks, not when the command was sent
                state.connected, state.error, state.retry_at, state.reconnecting = True, None, None, False
                self._changed()
            if isinstance(message, RunsMessage):
                return self._on_runs(state, message.runs, now)
            if isinstance(message, LogMessage):
                tracker = state.runs.get(message.run)
                if tracker is not None:
                    self._add_alerts(state, tracker.feed(message.offset, message.ino, message.data, now),
                                     backlog=tracker.backlog)
            elif isinstance(message, MetricsMessage):
                tracker = state.runs.get(message.run)
                if tracker is not None:
                    tracker.feed_metrics(message.offset, message.data, restart=message.restart)
            elif isinstance(message, ResetMessage):
                tracker = state.runs.get(message.run)
                if tracker is not None:
                    self._add_alerts(state, tracker.reset(message.why, now))
            elif isinstance(message, SyncedMessage):
                self._on_synced(state, message.runs, now)
            elif isinstance(message, GpuMessage):
                self._on_gpu(state, message, now)
            elif isinstance(message, DiskMessage):
                self._add_alerts(state, state.disk.observe(message.free_bytes, message.total_bytes, now))
            else:
                return None  # heartbeats change nothing
            self._changed()
        return None

    def tick(self, target: Target) -> None:
        now = time.time()
        with self._lock:
            state = self._targets[target.name]
            for tracker in state.runs.values():
                self._add_alerts(state, tracker.settle(now), backlog=tracker.backlog)

    def disconnected(self, target: Target, error: str, retry_at: float) -> None:
        with self._lock:
            state = self._targets[target.name]
            state.connected, state.error, state.retry_at, state.failed_once = False, error, retry_at, True
            state.reconnecting = False
            self._changed()

    def reconnecting(self, target: Target) -> None:
        with self._lock:
            state = self._targets[target.name]
            state.retry_at, state.reconnecting = None, True
            self._changed()

    # -- message handling -----------------------------------------------------------------------------------

    def _on_runs(self, state: TargetState, records: tuple[RunRecord, ...], now: float) -> dict[str, object]:
        follow: dict[str, object] = {}
        seen = set()
        for record in records:
            run_id = record.run_id  # the codec keeps only records with a run id
            seen.add(run_id)
            tracker = state.runs.get(run_id)
            if tracker is None:
                tracker = state.runs[run_id] = RunTracker(state.target.name, record, history=self._history,
                                                          tail=self._tail, rules=self._rules)
                tracker.backlog = not state.got_runs  # there when the watch began: its log so far is old news
                follow[run_id] = self._first_look
            self._add_alerts(state, tracker.update_record(record, now))
        for gone in set(state.runs) - seen:  # its run directory was removed
            del state.runs[gone]
        every = [(name, t.run) for name, other in self._targets.items() for t in other.runs.values()]
        drained = self._drain.observe_target(state.target.name, [t.run for t in state.runs.values()], now)
        for alert in drained + self._drain.observe_sweeps(every, now):
            self.note(alert)
        state.got_runs = True
        self._changed()
        return follow

    def _on_synced(self, state: TargetState, run_ids: tuple[str, ...], now: float) -> None:
        for run_id in run_ids:
            tracker = state.runs.get(run_id)
            if tracker is None:
                continue
            tracker.synced = True
            if tracker.backlog:  # the old content is read: what it still held (a final traceback) is old too
                self._add_alerts(state, tracker.settle(now), backlog=True)
                tracker.backlog = False

    def _on_gpu(self, state: TargetState, message: GpuMessage, now: float) -> None:
        state.got_gpus = True
        if message.error is not None:
            state.gpus.error = message.error
            return
        samples = state.gpus.sample(message.csv, now)
        for tracker in state.runs.values():
            if tracker.run.state not in TERMINAL_STATES:
                self._add_alerts(state, tracker.observe_gpus(samples, now))

    def _add_alerts(self, state: TargetState, alerts: list[Alert], *, backlog: bool = False) -> None:
        if alerts:
            self._alerts.extend(alert_view(a, state.target.name) for a in alerts)
            self._alert_backlog.extend([backlog] * len(alerts))
            self._alert_total += len(alerts)
            self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._lock.notify_all()

    def _host_views(self) -> tuple[HostView, ...]:
        now = time.time()
        hosts: dict[str, list[TargetState]] = {}
        for state in self._targets.values():
            hosts.setdefault(state.target.host.name, []).append(state)
        views = []
        for name, states in hosts.items():
            down = [s for s in states if not s.connected]
            retry = [s.retry_at for s in down if s.retry_at is not None]
            disks = [s.disk for s in states if s.disk.free_bytes is not None]
            least = min(disks, key=lambda d: d.free_bytes) if disks else None  # the container nearest to full
            views.append(HostView(name=name, connected=len(down) < len(states),  # while any container answers
                                  unreachable=tuple(s.target.name for s in down),
                                  error=next((s.error for s in down if s.error), None),
                                  retry_in_s=max(0.0, min(retry) - now) if retry else None,
                                  reconnecting=any(s.reconnecting for s in down),
                                  free_bytes=least.free_bytes if least else None,
                                  total_bytes=least.total_bytes if least else None,
                                  low_disk=any(d.low for d in disks)))
        return tuple(views)

    # -- actions --------------------------------------------------------------------------------------------

    def _target_of(self, run_id: str) -> Target:
        with self._lock:
            for state in self._targets.values():
                if run_id in state.runs:
                    return state.target
        raise TargetNotFound(f"no run {run_id!r} on the watched targets")

    def _lines(self, run_id: str, start: int, stop: int) -> LinesAnswer:
        if run_id in self._jobs:  # a job's log is rank 0's, on node 0
            run_id = self._jobs[run_id][0].run_id
        answer = self.client.log_lines(self._target_of(run_id), run_id, start, stop)
        self._line_counts[run_id] = (time.monotonic(), int(answer.total))
        return answer


def _resume_point(tracker: RunTracker, first_look: dict[str, int]) -> object:
    if tracker.offset is None:
        return {**first_look, "metrics": tracker.metrics_offset}
    return {"offset": tracker.offset, "ino": tracker.ino, "fp": base64.b64encode(tracker.fingerprint).decode(),
            "metrics": tracker.metrics_offset}
