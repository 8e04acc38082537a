"""A DashboardSource for tests: thread-safe, mutated by the test, recording every action it is asked for.

It behaves like the live source where the dashboard can tell: `kill` takes a moment and leaves the run
`killed` (with an `ended` alert), killing an ended run is a no-op, `cleanup` with dry_run changes nothing,
and a log can claim millions of lines, made up on demand, while every requested range is recorded.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from dflash_records.plans import CleanupAction, CleanupAnswer, Finding
from orchestrator.watch.model import ActionResult, AlertView, GpuView, RunView, Snapshot

TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})
SIGTERM = 15


class FakeSource:
    def __init__(self, snapshot: Snapshot, *, kill_delay_s: float = 0.1,
                 cleanup_plan: ActionResult | None = None) -> None:
        self._lock = threading.Condition()
        self._snapshot = snapshot
        self._version = 0
        self._seen_version = -1  # the first wait reports a change: the dashboard has seen nothing yet
        self._kill_delay_s = kill_delay_s
        self._cleanup_plan = cleanup_plan or ActionResult(ok=True, message="dry run: 1 action", cleanup=CleanupAnswer(
            ok=True, dry_run=True,
            actions=(CleanupAction(action="end_stuck_parent", ok=True, description=(
                "end stuck parent 4242 (python train.py) of 2 zombie(s): 2 zombie child(ren) it never reaps")),),
            findings=(Finding(kind="zombies_of_init", advice="only a container restart clears them",
                              description="3 zombie(s) of PID 1: only a container restart clears them"),)))
        self._log_counts: dict[str, int] = {}
        self._log_makers: dict[str, Callable[[int], str]] = {}
        self.kill_calls: list[tuple[str, float]] = []
        self.cleanup_calls: list[tuple[str, bool]] = []
        self.log_requests: list[tuple[str, int, int]] = []
        self.closed = False

    # -- what the test does --------------------------------------------------------------------------
    def mutate(self, change: Callable[[Snapshot], Snapshot]) -> None:
        with self._lock:
            self._snapshot = change(self._snapshot)
            self._version += 1
            self._lock.notify_all()

    def update_run(self, run_id: str, **fields) -> None:
        self.mutate(lambda snap: dataclasses.replace(snap, runs=tuple(
            dataclasses.replace(run, **fields) if run.run_id == run_id else run for run in snap.runs)))

    def set_host(self, name: str, **fields) -> None:
        self.mutate(lambda snap: dataclasses.replace(snap, hosts=tuple(
            dataclasses.replace(host, **fields) if host.name == name else host for host in snap.hosts)))

    def add_alert(self, alert: AlertView) -> None:
        self.mutate(lambda snap: dataclasses.replace(snap, alerts=snap.alerts + (alert,)))

    def set_gpus(self, gpus: tuple[GpuView, ...]) -> None:
        self.mutate(lambda snap: dataclasses.replace(snap, gpus=gpus))

    def set_log(self, run_id: str, count: int, make_line: Callable[[int], str] = lambda i: f"line {i}") -> None:
        with self._lock:
            self._log_counts[run_id] = count
            self._log_makers[run_id] = make_line

    def run(self, run_id: str) -> RunView:
        with self._lock:
            return next(run for run in self._snapshot.runs if run.run_id == run_id)

    # -- DashboardSource -------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            self._seen_version = self._version
            return self._snapshot

    def wait_for_change(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._version != self._seen_version, timeout=timeout)

    def kill(self, run_id: str, *, grace: float) -> ActionResult:
        with self._lock:
            self.kill_calls.append((run_id, grace))
            run = next((run for run in self._snapshot.runs if run.run_id == run_id), None)
        if run is None:
            return ActionResult(ok=False, message=f"no run {run_id}")
        if run.state in TERMINAL:
            return ActionResult(ok=True, message=f"run {run_id} had already ended ({run.state})")
        time.sleep(self._kill_delay_s)  # the real kill returns once nothing of the run is left
        ended_at = "2026-12-01T12:00:30Z"
        self.update_run(run_id, state="killed", signal=SIGTERM, ended_at=ended_at)
        self.add_alert(AlertView(time=ended_at, run_id=run_id, target=run.target, kind="ended", severity="info",
                                 message=f"run {run_id} killed (signal {SIGTERM})"))
        return ActionResult(ok=True, message=f"run {run_id} killed")

    def cleanup(self, target: str, *, dry_run: bool) -> ActionResult:
        with self._lock:
            self.cleanup_calls.append((target, dry_run))
        if dry_run:
            return self._cleanup_plan
        plan = self._cleanup_plan.cleanup or CleanupAnswer()
        done = tuple(replace(action, done=True) for action in plan.actions)
        return ActionResult(ok=True, message="cleanup done: 1 action",
                            cleanup=replace(plan, dry_run=False, actions=done))

    def log_line_count(self, run_id: str) -> int:
        with self._lock:
            return self._log_counts.get(run_id, len(self.run(run_id).log_tail))

    def log_lines(self, run_id: str, start: int, stop: int) -> list[str]:
        with self._lock:
            self.log_requests.append((run_id, start, stop))
            count = self._log_counts.get(run_id)
            if count is None:
                return list(self.run(run_id).log_tail[start:stop])
            make_line = self._log_makers[run_id]
        return [make_line(i) for i in range(max(start, 0), min(stop, count))]

    def close(self) -> None:
        self.closed = True
