"""What the dashboard shows, as plain immutable data: the contract between data sources and the TUI.

A data source (live SSH streams, or a fake in tests) produces Snapshots; the TUI renders them and never does
IO itself. `dflashctl watch --once --json` prints `Snapshot.as_dict()`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from dflash_records.gpu import GpuRow
from dflash_records.plans import CleanupAnswer
from dflash_records.protocol import TERMINAL_STATES
from dflash_records.step import StepRecord



@dataclass(frozen=True)
class MetricPoint:
    step: int
    loss: float | None = None
    acc: float | None = None
    streak: float | None = None
    tok_per_s: float | None = None
    tau_replay: float | None = None   # τ of replayed decoding rounds on the step's batch
    tau_heldout: float | None = None  # the same on the held-out split (eval_every steps only)
    tau_eval: float | None = None     # real speculative decoding of held-out prompts (eval_prompts)
    # DDTree rounds replayed on the held-out split: (node budget, τ), smallest budget first (eval_every steps)
    tau_tree_heldout: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class NodeView:
    """One node of a multi-node job."""

    run_id: str
    target: str
    node_rank: int
    state: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class Bottleneck:
    """The stage that bounds a run (data / target / drafter / communication / host) and the evidence, one line:
    `drafter-bound: prefetch queue full 50/50, hidden-state queue 15/50, GPUs 0-4 at 0 %`."""

    bound_by: str
    evidence: str


@dataclass(frozen=True)
class RunView:
    run_id: str
    target: str
    name: str
    state: str                       # queued / starting / running / succeeded / failed / killed / lost
    phase: str | None = None         # loading_dataset ... training, finished (from the log); ended once it ended
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    created_at: str | None = None
    ended_at: str | None = None
    log_path: str | None = None
    gpus: tuple[int, ...] = ()
    grace_s: float | None = None     # the seconds a kill waits after TERM, as recorded at launch
    attempt: int | None = None       # under a restart policy: the supervisor's attempt, of max_attempts
    max_attempts: int | None = None
    restart_at: str | None = None    # set in the backoff between two attempts
    reason: str | None = None        # why it ended without another attempt: hung, crash loop
    queue_position: int | None = None  # while queued: its place in its container's queue (1: the next to start)
    waits_for: str | None = None     # while queued: what for (`GPU 1`, `2 GPUs`, display.waiting_for)
    last_step: int | None = None
    loss: float | None = None
    acc: float | None = None
    streak: float | None = None
    lr: float | None = None
    tok_per_s: float | None = None
    eta_s: float | None = None
    q_pre: tuple[int, ...] = ()
    q_hs: tuple[int, ...] = ()
    exceptions: int = 0
    history: tuple[MetricPoint, ...] = ()     # one point per step line, oldest first (bounded by the source)
    log_tail: tuple[str, ...] = ()            # the last lines of the log, oldest first
    exception_texts: tuple[str, ...] = ()     # whole tracebacks / error lines, oldest first
    nodes: tuple[NodeView, ...] = ()          # a multi-node job: its nodes (run_id is then the job id)
    bottleneck: Bottleneck | None = None      # a live run's bounding stage (orchestrator/watch/bottleneck.py)
    tau_replay: float | None = None           # the latest τ replayed on a training batch
    tau_heldout: float | None = None          # the latest τ replayed on the held-out split
    tau_eval: float | None = None             # the latest τ of real speculative decoding of held-out prompts
    tau_tree_heldout: tuple[tuple[int, float], ...] = ()  # the latest DDTree τ per node budget, held-out replay
    sweep_id: str | None = None               # a sweep's run: its sweep, and its rank there (1: best so far)
    sweep_rank: int | None = None

    @property
    def tau(self) -> float | None:
        """The τ that best predicts serving: measured on held-out prompts where the run decodes them, else
        replayed on the held-out split, else on its training batches."""
        for value in (self.tau_eval, self.tau_heldout, self.tau_replay):
            if value is not None:
                return value
        return None


@dataclass(frozen=True)
class GpuView:
    """One GPU of a watched target: its latest row (what nvidia-smi said; whether it is idle while holding
    memory is the row's own) and its recent samples for the sparklines."""
    target: str
    row: GpuRow
    utilization_history: tuple[float, ...] = ()   # recent samples, oldest first
    memory_history: tuple[float, ...] = ()

    def as_dict(self) -> dict:
        """Flat, as `watch --once --json` prints it: the target, the row's fields, the histories."""
        return {"target": self.target, **self.row.to_dict(), "utilization_history": self.utilization_history,
                "memory_history": self.memory_history}


@dataclass(frozen=True)
class HostView:
    name: str
    connected: bool                 # some watched container of it answers (the others: unreachable, error)
    error: str | None = None
    retry_in_s: float | None = None
    reconnecting: bool = False  # a connect attempt is under way (the countdown has run out)
    free_bytes: int | None = None   # free space where runs are written, of its watched container nearest to full
    total_bytes: int | None = None
    low_disk: bool = False          # some watched container of it is below the low_disk alert's mark
    unreachable: tuple[str, ...] = ()  # its watched containers that do not answer now


@dataclass(frozen=True)
class AlertView:
    time: str            # ISO 8601 UTC
    run_id: str | None
    target: str | None
    kind: str            # exception / ended / stall / gpu_idle / throughput / nan / starvation / low_disk / ...
    severity: str        # info / warning / error
    message: str
    sweep_id: str | None = None  # a sweep's alert (queue_drained): run_id and target are None


@dataclass(frozen=True)
class Snapshot:
    taken_at: str
    runs: tuple[RunView, ...] = ()
    gpus: tuple[GpuView, ...] = ()
    hosts: tuple[HostView, ...] = ()
    alerts: tuple[AlertView, ...] = ()   # newest last
    gpu_errors: dict[str, str] = field(default_factory=dict)  # target -> why it has no GPU samples

    def as_dict(self) -> dict:
        return {**asdict(self), "gpus": [gpu.as_dict() for gpu in self.gpus]}


# `watch --once`: a bounded summary of each run, its last RECENT steps and log lines (--history N for more, up to
# the dashboard's own MAX_HISTORY); a fleet's whole histories made a --json of 61-120 MB for 256 runs
RECENT = 20
MAX_HISTORY = 2000
FIRST_LOOK_PER_STEP = 1024  # bytes of a log's (and a metrics.jsonl's) end that hold one step, and room to spare
MIN_FIRST_LOOK = 16 * 1024


def first_look(steps: int) -> int:
    """How much of each run's log and metrics.jsonl end a snapshot of its last `steps` steps has the agent send
    (the agent sends 256 KiB at most: the dashboard's first look)."""
    return max(MIN_FIRST_LOOK, steps * FIRST_LOOK_PER_STEP)


def summarise_ended(snapshot: Snapshot) -> Snapshot:
    """The snapshot with every ended run (and ended job) cut to its summary: its record, last step, metrics and
    last exception, without its log tail and metrics history. What `watch --once` prints unless `--all`: a
    fleet's hundreds of old runs would otherwise print every step of each."""
    return replace(snapshot, runs=tuple(
        replace(run, history=(), log_tail=(), exception_texts=run.exception_texts[-1:])
        if run.state in TERMINAL_STATES else run for run in snapshot.runs))


@dataclass(frozen=True)
class RunStatus:
    """What a notification says of a run besides its alert: who it is, how it is, its last step line."""

    run_id: str
    target: str
    name: str
    state: str
    conditions: frozenset[str] = frozenset()  # alert conditions raised and not cleared (stall, nan, ...)
    last_step_line: str | None = None
    relaunchable: bool = False  # lost, with restarts left under its policy, not relaunched yet
    job: JobNode | None = None  # the job it is a node of
    grace_s: float | None = None  # its kill grace: what a relaunch gives whatever still runs of it to end
    last_step: StepRecord | None = None  # the last step's record, with its metrics.jsonl figures where they came


@dataclass(frozen=True)
class JobNode:
    """A run's place in a multi-node job, whether the node may be relaunched with its job (ended `lost` or
    `failed`, not in a crash loop, with relaunches left under the job's restart policy, not relaunched yet), and
    whether it ended with torchrun's worker restarts unspent (dflash_records/restart.restarts_unspent)."""

    job_id: str
    node_rank: int
    nnodes: int
    relaunchable: bool = False
    restarts_unspent: bool = False


@dataclass(frozen=True)
class AlertFeed:
    """The alerts added since a cursor, with every run's status and the hosts as they are now."""

    cursor: int                       # pass it back to get only what came after
    version: int                      # the source's change counter (to wait for the next change)
    alerts: tuple[AlertView, ...] = ()
    backlog: tuple[bool, ...] = ()    # per alert: found in what a log held when the watch began (old news)
    runs: dict[str, RunStatus] = field(default_factory=dict)
    hosts: tuple[HostView, ...] = ()

    def flagged(self) -> list[tuple[AlertView, bool]]:
        """Each alert with its backlog flag (False where the feed carries none)."""
        return list(zip(self.alerts, self.backlog or (False,) * len(self.alerts)))


@dataclass(frozen=True)
class ActionResult:
    """What a kill or a cleanup from the dashboard came to: its one line, and a cleanup's whole answer (its plan,
    on a dry run)."""

    ok: bool
    message: str
    cleanup: CleanupAnswer | None = None


class DashboardSource(Protocol):
    """What the TUI needs from the controller. Methods may block: the TUI calls them from worker threads."""

    def snapshot(self) -> Snapshot:
        """The current state of everything watched."""

    def wait_for_change(self, timeout: float) -> bool:
        """Block until something changed (True) or the timeout passed (False)."""

    def kill(self, run_id: str, *, grace: float) -> ActionResult: ...

    def cleanup(self, target: str, *, dry_run: bool) -> ActionResult: ...

    def log_line_count(self, run_id: str) -> int:
        """Lines of the run's whole log known so far (for the full-log screen's scrollbar)."""

    def log_lines(self, run_id: str, start: int, stop: int) -> list[str]:
        """Lines [start, stop) of the run's log; only what is visible is ever asked for."""

    def close(self) -> None: ...
