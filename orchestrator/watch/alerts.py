"""Alert rules for one run: fed with parsed log events, state changes and GPU samples, they say what a person
watching should be told, once.

DiskHealth does the same for the free space of one target's runs directory (a target's alert, no run id).

Pure: no IO and no clock. Every call takes `now` (seconds, any epoch) so tests drive time and a replayed log
gives the same alerts. A condition (stall, idle GPUs, slow throughput, NaN loss, starvation) raises one alert
when it starts and none while it lasts; once it clears it may raise again.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from dflash_records.gpu import GPU_HELD_MIB, GPU_IDLE_UTIL_PCT, GpuRow, idle_and_held
from dflash_records.protocol import FAILED, KILLED, LOST, LOW_FREE_BYTES, LOW_FREE_FRACTION, SUCCEEDED, low_free
from dflash_records.restart import attempt_end
from dflash_records.run import RunRecord

from ..display import clip, format_bytes, format_duration, format_gib, format_rate
from ..trainlog.parser import ExceptionEvent, PhaseEvent, StepEvent
from ..alertkinds import (ENDED, ERROR, EXCEPTION, GPU_IDLE, INFO, LOW_DISK, NAN, RESTARTED, STALL, STARVATION,
                         THROUGHPUT, WARNING)

TERMINAL_SEVERITY = {SUCCEEDED: INFO, FAILED: ERROR, KILLED: WARNING, LOST: ERROR}


@dataclass(frozen=True, slots=True)
class Alert:
    time: float
    run_id: str | None  # None: the alert is a target's (low_disk)
    kind: str
    severity: str
    message: str


@dataclass(frozen=True)
class AlertRules:
    """Thresholds. The defaults suit steps of seconds to minutes, like the seed run's ~30 s."""

    stall_factor: float = 5.0  # a stall is no step for this many median step intervals...
    stall_floor_s: float = 120.0  # ...and never less than this
    stall_startup_s: float = 900.0  # before `stall_min_intervals` intervals are known (compilation, warm-up)
    stall_min_intervals: int = 3
    interval_window: int = 50
    gpu_idle_window_s: float = 60.0  # memory held at 0 % for this long while training
    gpu_idle_min_memory_mib: float = GPU_HELD_MIB  # below this a GPU holds nothing worth mentioning
    gpu_idle_max_util_pct: float = GPU_IDLE_UTIL_PCT
    throughput_ratio: float = 0.5  # tok/s under this share of the trailing median...
    throughput_consecutive: int = 5  # ...for this many step lines in a row
    throughput_window: int = 100
    throughput_min_history: int = 20
    starvation_consecutive: int = 3
    prefetch_full_fraction: float = 0.9
    prefetch_capacity: int | None = None  # None: the deepest prefetch queue seen counts as full
    exception_repeat_s: float = 60.0  # the same exception again within this time raises no new alert
    min_free_bytes: float | None = None  # low_disk: less free than this where a target's runs write...
    min_free_fraction: float | None = None  # ...or less than this share; None: doctor's marks (2 GiB, 5 %)


@dataclass(frozen=True, slots=True)
class _IdleGpu:
    since: float  # first sample of the streak of samples with memory held at 0 %
    last: float
    memory_mib: float


class RunHealth:
    """The health of one run. Each `observe_*` and `check` returns the alerts that are new at `now`."""

    def __init__(self, run_id: str, *, rules: AlertRules | None = None, gpu_indices: Iterable[int] | None = None):
        self.run_id = run_id
        self.rules = rules or AlertRules()
        self.gpu_indices = None if gpu_indices is None else frozenset(gpu_indices)
        self.state: str | None = None
        self.phase: str | None = None
        self._active: set[str] = set()
        self._last_step_at: float | None = None
        self._intervals: deque[float] = deque(maxlen=self.rules.interval_window)
        self._tok_history: deque[float] = deque(maxlen=self.rules.throughput_window)
        self._low_throughput_run = 0
        self._starving_run = 0
        self._deepest_prefetch = 0
        self._idle: dict[int, _IdleGpu] = {}
        self._training_since: float | None = None
        self._recent_exceptions: dict[tuple[str | None, str], float] = {}
        self._attempt: int | None = None  # the supervisor's attempt number last seen

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_SEVERITY

    @property
    def conditions(self) -> frozenset[str]:
        """The conditions raised and not cleared since (a stall, idle GPUs, a NaN loss...)."""
        return frozenset(self._active)

    @property
    def training(self) -> bool:
        return self.phase == "training" and not self.ended

    # -- inputs

    def observe_events(self, events: Iterable[object], now: float) -> list[Alert]:
        alerts: list[Alert] = []
        for event in events:
            alerts += self.observe_event(event, now)
        return alerts

    def observe_event(self, event: object, now: float) -> list[Alert]:
        if isinstance(event, StepEvent):
            return self._observe_step(event, now)
        if isinstance(event, ExceptionEvent):
            return self._observe_exception(event, now)
        if isinstance(event, PhaseEvent):
            self._enter_phase(event.phase, now)
        return []

    def observe_state(self, state: str, now: float, *, record: RunRecord | None = None) -> list[Alert]:
        """A run state from the run directory: starting, running, or a terminal one; `record` (the run's whole
        record) tells of its attempts and how it ended (in RunRecord.ended_text's words, as ps and kill say it)."""
        if self.ended:
            return []  # a run ends exactly once; a late or repeated report changes nothing
        self.state = state
        run = record or RunRecord()
        alerts = self._observe_attempt(run, now)
        if not self.ended:
            return alerts
        self._clear(STALL, GPU_IDLE, THROUGHPUT, STARVATION, NAN)
        ended = replace(run, state=state).ended_text()
        return alerts + [self._alert(now, ENDED, TERMINAL_SEVERITY[state], f"run {ended}")]

    def _observe_attempt(self, run: RunRecord, now: float) -> list[Alert]:
        """One `restarted` alert per new attempt the supervisor started (none for the attempt a watch first
        finds: it began before the watch did)."""
        attempt, seen = run.attempt, self._attempt
        if not isinstance(attempt, int):
            return []
        self._attempt = attempt if seen is None else max(seen, attempt)
        if seen is None or attempt <= seen:
            return []
        self._clear(STALL, GPU_IDLE, THROUGHPUT, STARVATION, NAN)  # a new process: its conditions start over
        self._last_step_at = None
        before = run.attempt_record(attempt - 1)
        why = f" after attempt {attempt - 1} {attempt_end(before)}" if before else ""
        total = run.max_attempts
        return [self._alert(now, RESTARTED, WARNING,
                            f"restarted: attempt {attempt}{f'/{total}' if total else ''}{why}")]

    def observe_gpus(self, sample: Iterable[GpuRow], now: float) -> list[Alert]:
        """One nvidia-smi sample of the target's GPUs, taken at `now`."""
        for row in sample:
            if self.gpu_indices is None or row.index in self.gpu_indices:
                self._track_idle(row, now)
        return self._check_gpus(now)

    def check(self, now: float) -> list[Alert]:
        """Conditions that arise from time passing alone (call it periodically)."""
        return self._check_stall(now)

    # -- conditions

    def _enter_phase(self, phase: str, now: float) -> None:
        if phase == self.phase:
            return
        self.phase = phase
        if phase == "training":
            self._training_since = now
        else:  # finished, or a trainer that restarted inside the run and is loading again
            self._clear(STALL, GPU_IDLE, THROUGHPUT, STARVATION)
            self._last_step_at = None  # the step times and rates of the last process say little of the next
            self._intervals.clear()
            self._tok_history.clear()
            self._low_throughput_run = self._starving_run = 0

    def _observe_step(self, step: StepEvent, now: float) -> list[Alert]:
        if self.phase != "finished":
            self._enter_phase("training", now)
        if self._last_step_at is not None and now > self._last_step_at:
            # lines that arrive in one batch (attaching to an old log) say nothing about the step time
            self._intervals.append(now - self._last_step_at)
        self._last_step_at = now
        self._clear(STALL)
        return self._check_loss(step, now) + self._check_throughput(step, now) + self._check_queues(step, now)

    def _observe_exception(self, event: ExceptionEvent, now: float) -> list[Alert]:
        key = (event.exc_type, event.message)
        seen_at = self._recent_exceptions.get(key)
        self._recent_exceptions = {k: t for k, t in self._recent_exceptions.items()
                                   if now - t < self.rules.exception_repeat_s}
        self._recent_exceptions[key] = now
        if seen_at is not None and now - seen_at < self.rules.exception_repeat_s:
            return []
        if event.exc_type and event.message:
            what = f"{event.exc_type}: {event.message}"
        else:  # `KeyboardInterrupt`, or a traceback cut off before its exception line
            what = event.exc_type or event.message or event.text
        kind = "traceback" if event.is_traceback else "error line"
        where = f" at log line {event.line_no}" if event.line_no else ""
        return [self._alert(now, EXCEPTION, ERROR, f"{kind}{where}: {_shorten(what)}")]

    def _check_stall(self, now: float) -> list[Alert]:
        if not self.training or self._last_step_at is None:
            return []
        silent_s = now - self._last_step_at
        if len(self._intervals) >= self.rules.stall_min_intervals:
            median = statistics.median(self._intervals)
            limit = max(self.rules.stall_floor_s, self.rules.stall_factor * median)
            why = (f"{self.rules.stall_factor:g}x the median step interval {_duration(median)}"
                   if limit > self.rules.stall_floor_s else f"the stall limit {_duration(limit)}")
        else:
            limit, why = self.rules.stall_startup_s, "the start-up limit"
        if silent_s <= limit:
            return []
        return self._raise(now, STALL, WARNING, f"no new step for {_duration(silent_s)} (more than {why})")

    def _track_idle(self, row: GpuRow, now: float) -> None:
        held_idle = idle_and_held(
            row.memory_used_mib, row.utilization_pct, held_mib=self.rules.gpu_idle_min_memory_mib,
            idle_pct=self.rules.gpu_idle_max_util_pct,
        )
        if not held_idle:
            self._idle.pop(row.index, None)
            return
        since = self._idle[row.index].since if row.index in self._idle else now
        self._idle[row.index] = _IdleGpu(since, now, row.memory_used_mib)  # type: ignore[arg-type]

    def _check_gpus(self, now: float) -> list[Alert]:
        if not self.training or self._training_since is None:
            self._clear(GPU_IDLE)
            return []
        # memory held at 0 % while the data set and the targets load is normal: count from training's start
        idle_s = {index: gpu.last - max(gpu.since, self._training_since) for index, gpu in sorted(self._idle.items())}
        idle = {index: self._idle[index] for index, s in idle_s.items() if s >= self.rules.gpu_idle_window_s}
        if not idle:
            self._clear(GPU_IDLE)
            return []
        held = format_gib(sum(gpu.memory_mib for gpu in idle.values()))
        longest = max(idle_s[index] for index in idle)
        message = (f"GPU{'s' if len(idle) > 1 else ''} {','.join(map(str, idle))} hold {held} GiB at "
                   f"{self.rules.gpu_idle_max_util_pct:g} % utilisation for {_duration(longest)} while training")
        return self._raise(now, GPU_IDLE, WARNING, message)

    def _check_loss(self, step: StepEvent, now: float) -> list[Alert]:
        if step.loss is None:
            return []
        if math.isfinite(step.loss):
            self._clear(NAN)
            return []
        return self._raise(now, NAN, ERROR, f"loss is {step.loss} at step {step.step}")

    def _check_throughput(self, step: StepEvent, now: float) -> list[Alert]:
        tokens = step.tok_per_s
        if tokens is None or not math.isfinite(tokens):
            return []
        history, rules = self._tok_history, self.rules
        median = statistics.median(history) if len(history) >= rules.throughput_min_history else None
        history.append(tokens)
        if median is None or tokens >= rules.throughput_ratio * median:
            self._low_throughput_run = 0
            self._clear(THROUGHPUT)
            return []
        self._low_throughput_run += 1
        if self._low_throughput_run < rules.throughput_consecutive:
            return []
        share = 100 * tokens / median if median else 0.0
        message = (f"throughput {_tokens(tokens)} is {share:.0f} % of its trailing median {_tokens(median)} "
                   f"for {self._low_throughput_run} steps")
        return self._raise(now, THROUGHPUT, WARNING, message)

    def _check_queues(self, step: StepEvent, now: float) -> list[Alert]:
        if not step.q_pre or not step.q_hs:
            return []  # a trainer without one of the two queues cannot starve this way
        self._deepest_prefetch = max(self._deepest_prefetch, *step.q_pre)
        capacity = self.rules.prefetch_capacity or self._deepest_prefetch
        full = capacity > 0 and min(step.q_pre) >= self.rules.prefetch_full_fraction * capacity
        if not (full and max(step.q_hs) == 0):
            self._starving_run = 0
            self._clear(STARVATION)
            return []
        self._starving_run += 1
        if self._starving_run < self.rules.starvation_consecutive:
            return []
        message = (f"hidden-state queues empty (q_hs={list(step.q_hs)}) while prefetch queues are full "
                   f"(q_pre={list(step.q_pre)}) for {self._starving_run} steps")
        return self._raise(now, STARVATION, WARNING, message)

    # -- debounce

    def _raise(self, now: float, kind: str, severity: str, message: str) -> list[Alert]:
        if kind in self._active:
            return []
        self._active.add(kind)
        return [self._alert(now, kind, severity, message)]

    def _clear(self, *kinds: str) -> None:
        self._active.difference_update(kinds)

    def _alert(self, now: float, kind: str, severity: str, message: str) -> Alert:
        return Alert(now, self.run_id, kind, severity, message)


class DiskHealth:
    """The free space of the filesystem one target's runs are written to: one alert when it runs low, none
    while it stays low, another once it recovered and ran low again."""

    def __init__(self, target: str, *, rules: AlertRules | None = None) -> None:
        self.target = target
        self.rules = rules or AlertRules()
        self.free_bytes: int | None = None
        self.total_bytes: int | None = None
        self.low = False

    def observe(self, free_bytes: int, total_bytes: int, now: float) -> list[Alert]:
        self.free_bytes, self.total_bytes = free_bytes, total_bytes
        mark = LOW_FREE_BYTES if self.rules.min_free_bytes is None else self.rules.min_free_bytes
        fraction = LOW_FREE_FRACTION if self.rules.min_free_fraction is None else self.rules.min_free_fraction
        low = low_free(free_bytes, total_bytes, min_bytes=mark, fraction=fraction)
        raised, self.low = low and not self.low, low
        if not raised:
            return []
        share = f" ({100 * free_bytes / total_bytes:.1f} %)" if total_bytes else ""
        return [Alert(now, None, LOW_DISK, ERROR if free_bytes < mark / 8 else WARNING,
                      f"{self.target}: only {format_bytes(free_bytes)} free of {format_bytes(total_bytes)}{share} "
                      f"where its runs write: a run that fills it loses its log and checkpoints")]


def _shorten(text: str, limit: int = 300) -> str:
    return clip(text.strip().splitlines()[0] if text.strip() else "", limit)


def _duration(seconds: float) -> str:
    return format_duration(max(0, int(seconds)))  # whole seconds: a message, not a measurement


def _tokens(per_s: float) -> str:
    return f"{format_rate(per_s)} tok/s"
