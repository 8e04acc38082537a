"""What the live source knows of each run and each GPU: parser and health fed from the watch stream, and the
bounded histories the dashboard draws. Pure state: no IO, no threads, no clock (callers pass `now`)."""
from __future__ import annotations

from collections import deque
from dataclasses import replace

from dflash_records.gpu import GpuRow, parse_query_csv
from dflash_records.protocol import (FAILED_STATES, FINGERPRINT_BYTES, LIVE_STATES, LOST, QUEUED, STARTING,
                                     TERMINAL_STATES, iso_utc)
from dflash_records.restart import CRASH_LOOP, job_relaunches_left, restarts_unspent
from dflash_records.run import RunRecord
from dflash_records.step import QUEUE_FIELDS, RECORD_FIELDS
from dflash_records.stepfigures import with_exact

from ..display import waiting_for
from ..trainlog.lines import parse_metrics_jsonl_line, parse_step_times_line
from ..trainlog.parser import ExceptionEvent, LogLine, LogParser, PhaseEvent, StepEvent
from ..alertkinds import LOG_RESET, WARNING
from .alerts import Alert, AlertRules, RunHealth
from .bottleneck import RunSignals, diagnose
from .model import AlertView, GpuView, JobNode, MetricPoint, RunStatus, RunView

# The parser's fine-grained start-up phases, folded into the few the dashboard shows.
PHASE_SHOWN = {"loading_dataset": "loading_dataset", "dataset_loaded": "loading_dataset",
               "batches_per_epoch": "buckets", "bucket": "buckets", "loading_targets": "loading_targets",
               "target_loading": "loading_targets", "compiling": "compiling", "training": "training",
               "finished": "finished"}


def shown_phase(event: PhaseEvent, current: str | None) -> str | None:
    """The phase the dashboard shows after a start-up line: a trainer's own stage (`compiling 1/2`, its
    parenthesised detail left to the log) or one of the few folded phases."""
    if event.phase == "startup" and event.stage:
        return event.stage.split(" (", 1)[0][:40]
    return PHASE_SHOWN.get(event.phase, current)


def ended_phase(phase: str | None, state: str | None) -> str | None:
    """The phase a run shows: an ended run's says it ended (`finished` when the trainer said so itself), never
    the `training` a kill or a crash stopped it in."""
    if state not in TERMINAL_STATES or phase == "finished":
        return phase
    return "ended"


# the step record's figures a run's view shows the latest of (the queues are kept apart, the step is last_step)
STEP_VALUES = tuple(name for name in RECORD_FIELDS
                    if name not in ("elapsed_s", "step", "noise", "epoch") + QUEUE_FIELDS)
MAX_EXCEPTION_TEXTS = 20
MAX_EXACT_STEPS = 64  # metrics.jsonl records kept for step lines not read yet (the two files race)


class RunTracker:
    """One run: its record from the agent, its log parsed incrementally from byte offsets, its health."""

    def __init__(self, target: str, run: RunRecord, *, history: int, tail: int,
                 rules: AlertRules | None = None) -> None:
        self.target = target
        self.run_id: str = run.run_id
        self.run = run
        # a run that had ended before we looked raises no alerts: they would all be old news
        self.quiet = self.run.state in TERMINAL_STATES
        self.parser = LogParser()
        # a run launched with --gpus none has [] here: no GPU of its own to watch
        self.health = RunHealth(self.run_id, rules=rules, gpu_indices=self.run.gpus)
        self.offset: int | None = None  # the next byte of train.log we expect: the resume point
        self.ino: int | None = None
        self.fingerprint = b""  # the last bytes before `offset`: the agent checks the file still has them
        self.synced = False
        self.metrics_offset = -1  # the next byte of metrics.jsonl we expect (-1: none read yet)
        self.exact: dict[int, StepEvent] = {}  # step -> its metrics.jsonl record: the figures a step line rounds
        self.last_step_event: StepEvent | None = None  # the step line as read, before its exact figures
        # until its log is first read to the end: alerts found now come from what the log held before the watch
        # began (shown, never notified); set by the source for the runs that were already there
        self.backlog = False
        self.history: deque[MetricPoint] = deque(maxlen=history)
        self.tail: deque[str] = deque(maxlen=tail)
        self.exception_texts: deque[str] = deque(maxlen=MAX_EXCEPTION_TEXTS)
        self.exception_count = 0
        self.phase: str | None = None
        self.last_step: int | None = None
        self.last_step_line: str | None = None
        self.q_pre: tuple[int, ...] = ()
        self.q_hs: tuple[int, ...] = ()
        self.values: dict[str, float | tuple | None] = dict.fromkeys(STEP_VALUES)
        self.queue_capacity = 0  # the deepest any of its queues has been
        self.step_times: dict[str, float] = {}
        self.n_targets: int | None = None
        self._view: RunView | None = None
        self._diagnosed: tuple[RunView, tuple, RunView] | None = None

    # -- inputs

    def update_record(self, run: RunRecord, now: float) -> list[Alert]:
        changed = run != self.run
        gpus = self.run.gpus
        self.run = run
        if run.gpus != gpus:  # a run queued for any N GPUs holds those it was given once it starts
            self.health.gpu_indices = None if run.gpus is None else frozenset(run.gpus)
        self._view = None if changed else self._view
        return self._keep(self.health.observe_state(run.state or STARTING, now, record=run))

    def feed(self, offset: int, ino: int | None, data: bytes, now: float) -> list[Alert]:
        """New log bytes starting at `offset`; bytes we already have (a resend) are dropped."""
        if self.offset is not None and offset < self.offset:
            data = data[self.offset - offset:]
            offset = self.offset
        if not data:
            return []
        self.offset, self.ino = offset + len(data), ino
        self.fingerprint = (self.fingerprint + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]
        return self._events(self.parser.feed(data), now)

    def feed_metrics(self, offset: int, data: bytes, *, restart: bool = False) -> None:
        """New whole lines of metrics.jsonl from `offset` (`restart`: the file shrank and is sent from its start).
        A record's exact figures replace the rounded ones of its step line, whichever of the two came first."""
        if not restart and 0 <= offset < self.metrics_offset:
            data = data[self.metrics_offset - offset:]
            offset = self.metrics_offset
        self.metrics_offset = offset + len(data)
        for line in data.splitlines():
            record = parse_metrics_jsonl_line(line)
            if record is None or record.step is None:
                continue
            self.exact[record.step] = record
            while len(self.exact) > MAX_EXACT_STEPS:
                del self.exact[next(iter(self.exact))]
            if self.last_step_event is not None and record.step == self.last_step:
                self._view = None
                self._take_step(self.last_step_event, replace_last=True)

    def reset(self, why: str, now: float) -> list[Alert]:
        """The log was truncated, replaced or rewritten: say so in the tail and as an alert, then read the new
        content from its start (metrics history is kept; the lines before the mark are the old content's)."""
        self.parser = LogParser()
        self.offset = self.ino = None
        self.fingerprint = b""
        self.tail.append(f"--- dflashctl: train.log was {why}; reading it again from the start ---")
        self._view = None
        return self._keep([Alert(now, self.run_id, LOG_RESET, WARNING,
                                 f"train.log was {why}; the lines shown from here are its new content")])

    def settle(self, now: float) -> list[Alert]:
        return self._events(self.parser.settle(), now) + self._keep(self.health.check(now))

    def observe_gpus(self, sample: list[GpuRow], now: float) -> list[Alert]:
        return self._keep(self.health.observe_gpus(sample, now))

    # -- events

    def _events(self, events: list, now: float) -> list[Alert]:
        if not events:
            return []
        self._view = None
        # a step whose metrics.jsonl record came first is judged by its exact figures (a later record only redraws)
        events = [self._exact(e) if isinstance(e, StepEvent) else e for e in events]
        for event in events:
            self._take(event)
        return self._keep(self.health.observe_events(events, now))

    def _take(self, event: object) -> None:
        if isinstance(event, StepEvent):
            self._take_step(event)
        elif isinstance(event, ExceptionEvent):
            self.exception_count += 1
            self.exception_texts.append(event.text)
            self.tail.extend(event.text.split("\n"))
            return
        elif isinstance(event, PhaseEvent):
            self.phase = shown_phase(event, self.phase)
            self.n_targets = event.n_targets if event.phase == "loading_targets" else self.n_targets
        elif isinstance(event, LogLine) and event.text.startswith("  step times:"):
            self.step_times = parse_step_times_line(event.text) or self.step_times
        if isinstance(event, (StepEvent, PhaseEvent, LogLine)):
            self.tail.append(event.text)

    def _take_step(self, line: StepEvent, *, replace_last: bool = False) -> None:
        self.last_step_event = line
        step = self._exact(line)
        self.last_step_line = step.text
        if self.phase != "finished":
            self.phase = "training" if step.total is None else "generating"
        if step.step is not None:
            self.last_step = step.step
            if replace_last and self.history and self.history[-1].step == step.step:
                self.history.pop()
            self.history.append(MetricPoint(step.step, step.loss, step.acc, step.streak, step.tok_per_s,
                                            step.tau_replay, step.tau_heldout, step.tau_eval,
                                            step.tau_tree_heldout or ()))
        for name in STEP_VALUES:
            value = getattr(step, name)
            if value is not None:
                self.values[name] = value
        self.q_pre = step.q_pre if step.q_pre is not None else self.q_pre
        self.q_hs = step.q_hs if step.q_hs is not None else self.q_hs
        self.queue_capacity = max((self.queue_capacity, *self.q_pre, *self.q_hs))

    def _exact(self, line: StepEvent) -> StepEvent:
        """The step line with the figures of its metrics.jsonl record, where one came (the line keeps its text);
        a generate progress line (`total`) has none."""
        return with_exact(line, self.exact.get(line.step)) if line.total is None else line

    def _keep(self, alerts: list[Alert]) -> list[Alert]:
        return [] if self.quiet else alerts

    # -- output

    def status(self) -> RunStatus:
        r = self.run
        relaunchable = (r.state == LOST and not r.relaunched_as and not r.job_id
                        and len(r.attempts or []) < (r.max_attempts or 1))
        job = None
        if r.job_id:  # relaunched with its job only (notify/relaunch.jobs_to_relaunch)
            job = JobNode(r.job_id, int(r.node_rank or 0), int(r.nnodes or 1),
                          relaunchable=(r.state in FAILED_STATES and not r.relaunched_as and r.reason != CRASH_LOOP
                                        and job_relaunches_left(r.worker_restarts, r.job_relaunches) > 0),
                          restarts_unspent=restarts_unspent(r.worker_restarts, r.attempts))
        step = self._exact(self.last_step_event) if self.last_step_event is not None else None
        return RunStatus(self.run_id, self.target, r.name or "", r.state or STARTING,
                         self.health.conditions, self.last_step_line, relaunchable, job, _seconds(r.grace_s), step)

    def view(self) -> RunView:
        if self._view is None:
            self._view = self._build_view()
        return self._view

    def diagnosed_view(self, gpus: tuple[GpuView, ...]) -> RunView:
        """The view with the bounding stage named from the log and the target's GPUs (live runs only); kept
        while neither changed, so an unchanged run is the same object from one snapshot to the next."""
        view = self.view()
        if self._diagnosed is None or self._diagnosed[0] is not view or self._diagnosed[1] is not gpus:
            verdict = diagnose(self.signals(), gpus) if view.state in LIVE_STATES else None
            self._diagnosed = (view, gpus, replace(view, bottleneck=verdict) if verdict else view)
        return self._diagnosed[2]

    def signals(self) -> RunSignals:
        v = self.values
        return RunSignals(tgt_bps=v["tgt_batches_per_s"], dft_bps=v["dft_batches_per_s"], q_pre=self.q_pre,
                          q_hs=self.q_hs, queue_capacity=self.queue_capacity or None, step_times=self.step_times,
                          n_targets=self.n_targets, gpus=tuple(self.run.gpus or ()))

    def _build_view(self) -> RunView:
        r, v = self.run, self.values
        return RunView(
            run_id=self.run_id, target=self.target, name=r.name or "", state=r.state or STARTING,
            phase=ended_phase(self.phase, r.state), pid=r.pid, exit_code=r.exit_code, signal=r.signal,
            created_at=r.created_at, ended_at=r.ended_at, log_path=r.log_path,
            gpus=tuple(r.gpus or ()), grace_s=_seconds(r.grace_s), last_step=self.last_step,
            attempt=r.attempt, max_attempts=r.max_attempts, restart_at=r.restart_at, reason=r.reason,
            queue_position=r.queue_position if r.state == QUEUED else None,
            waits_for=waiting_for(r.gpus, r.gpu_count) if r.state == QUEUED else None,
            loss=v["loss"], acc=v["acc"], streak=v["streak"], lr=v["lr"], tok_per_s=v["tok_per_s"],
            eta_s=v["eta_s"], q_pre=self.q_pre, q_hs=self.q_hs, exceptions=self.exception_count,
            history=tuple(self.history), log_tail=tuple(self.tail), exception_texts=tuple(self.exception_texts),
            tau_replay=v["tau_replay"], tau_heldout=v["tau_heldout"], tau_eval=v["tau_eval"],
            tau_tree_heldout=v["tau_tree_heldout"] or (), sweep_id=r.sweep_id)


class GpuTracker:
    """The GPUs of one target: the latest sample of each and a short history for the sparklines."""

    def __init__(self, target: str, *, history: int) -> None:
        self.target = target
        self.history = history
        self.latest: dict[int, GpuRow] = {}
        self.util: dict[int, deque[float]] = {}
        self.memory: dict[int, deque[float]] = {}
        self.error: str | None = None
        self._views: tuple[GpuView, ...] | None = ()

    def sample(self, csv: str, now: float) -> list[GpuRow]:
        """The rows of one nvidia-smi sample (the watch stream's CSV), kept as the latest of each GPU."""
        gpus = parse_query_csv(csv)
        self.error = None if gpus else self.error
        for gpu in gpus:
            self.latest[gpu.index] = gpu
            if gpu.utilization_pct is not None:
                self.util.setdefault(gpu.index, deque(maxlen=self.history)).append(gpu.utilization_pct)
            if gpu.memory_used_mib is not None:
                self.memory.setdefault(gpu.index, deque(maxlen=self.history)).append(gpu.memory_used_mib)
        self._views = None
        return gpus

    def views(self) -> tuple[GpuView, ...]:
        if self._views is None:
            self._views = tuple(
                GpuView(self.target, gpu, tuple(self.util.get(index, ())), tuple(self.memory.get(index, ())))
                for index, gpu in sorted(self.latest.items()))
        return self._views


def _seconds(value: object) -> float | None:
    """A recorded duration, or None when the record has none (or not a usable one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return float(value)


def alert_view(alert: Alert, target: str) -> AlertView:
    return AlertView(time=iso_utc(alert.time, timespec="seconds"), run_id=alert.run_id, target=target, kind=alert.kind,
                     severity=alert.severity, message=alert.message)
