"""Which stage bounds a run: data, target, drafter, communication, or the host (GPU idle), with the evidence.

Pure logic: fed by what a run's tracker read from its log (batch rates, queue depths, the bundled trainer's
per-step phase times, how many target models it loaded) and by the GPU samples of its target. The verdict is
exact where the log says where each step's time went, and a heuristic from queues and rates otherwise.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from ..display import index_ranges
from .model import Bottleneck, GpuView

DATA, TARGET, DRAFTER, COMM, HOST = "data", "target", "drafter", "communication", "host"
FULL, LOW = 0.9, 0.1           # a queue this share of its capacity is full / nearly empty
IDLE_PCT = 5.0                 # a GPU below this utilisation waits
RATE_MARGIN = 1.05             # one stage this much slower than the other bounds the pipeline
RECENT_SAMPLES = 5             # GPU utilisation: the mean of the latest samples, not one noisy reading


@dataclass(frozen=True)
class RunSignals:
    """What a run's log says about its pipeline (every field optional: logs differ)."""

    tgt_bps: float | None = None
    dft_bps: float | None = None
    q_pre: tuple[int, ...] = ()
    q_hs: tuple[int, ...] = ()
    queue_capacity: int | None = None      # the deepest any queue of the run has been: queues are sized alike
    step_times: dict[str, float] = field(default_factory=dict)  # seconds per step: data ... comm, wall
    n_targets: int | None = None           # `Loading N target models...`: GPUs 0..N-1 of the run hold them
    gpus: tuple[int, ...] = ()             # the GPUs the run was launched on (empty: all of the target's)


def diagnose(signals: RunSignals, gpus: Sequence[GpuView]) -> Bottleneck | None:
    """The stage that bounds the run and why; None when the log and the GPUs tell nothing."""
    util = _utilisation(signals, gpus)
    if signals.step_times.get("wall"):
        return _from_step_times(signals.step_times, util)
    verdict = _from_queues(signals) or _from_rates(signals)
    if verdict is not None:
        bound_by, evidence = verdict
        waiting = _waiting_gpus(bound_by, signals, util)
        return _bottleneck(bound_by, evidence + _gpu_evidence(waiting, util))
    if util and all(pct < IDLE_PCT for pct in util.values()):
        return _bottleneck(HOST, ["nothing in the log names a stage", *_gpu_evidence(list(util), util)])
    return None


# ---------------------------------------------------------------------------------------------- exact

def _from_step_times(times: dict[str, float], util: dict[int, float]) -> Bottleneck:
    wall = times["wall"]
    shares = {DATA: times.get("data", 0.0), TARGET: times.get("target", 0.0),
              DRAFTER: times.get("drafter", 0.0) + times.get("optimizer", 0.0), COMM: times.get("comm", 0.0)}
    shares[HOST] = max(0.0, wall - sum(shares.values()))
    bound_by = max(shares, key=shares.__getitem__)
    named = {DATA: "data wait", TARGET: "target", DRAFTER: "drafter fwd/bwd+optimizer", COMM: "all-reduce",
             HOST: "host (GPU idle)"}
    ranked = sorted(shares, key=shares.__getitem__, reverse=True)
    lead = f"{named[bound_by]} {_ms(shares[bound_by])} of a {_ms(wall)} step ({_pct(shares[bound_by], wall)})"
    rest = [f"{named[name]} {_ms(shares[name])}" for name in ranked[1:] if shares[name] > 0]
    return _bottleneck(bound_by, [lead, *rest, *_gpu_evidence(list(util), util)])


# ---------------------------------------------------------------------------------------------- heuristic

def _from_queues(s: RunSignals) -> tuple[str, list[str]] | None:
    capacity = s.queue_capacity or 0
    if capacity <= 0 or not s.q_pre:
        return None
    pre = round(median(s.q_pre))
    prefetch = f"prefetch queue {_fill(pre, capacity)}{pre}/{capacity}"
    if pre <= LOW * capacity:
        return DATA, [prefetch]
    if not s.q_hs:
        return None
    hs = round(median(s.q_hs))
    hidden = f"hidden-state queue {_fill(hs, capacity)}{hs}/{capacity}"
    if hs >= FULL * capacity:
        return DRAFTER, [prefetch, hidden]
    if hs <= LOW * capacity:
        return TARGET, [prefetch, hidden]
    slower = _slower_stage(s)
    return (slower, [prefetch, hidden]) if slower else None


def _from_rates(s: RunSignals) -> tuple[str, list[str]] | None:
    slower = _slower_stage(s)
    if slower is None:
        return None
    return slower, [f"target {s.tgt_bps:.2f} b/s, drafter {s.dft_bps:.2f} b/s"]


def _slower_stage(s: RunSignals) -> str | None:
    if not s.tgt_bps or not s.dft_bps:
        return None
    if s.dft_bps * RATE_MARGIN < s.tgt_bps:
        return DRAFTER
    if s.tgt_bps * RATE_MARGIN < s.dft_bps:
        return TARGET
    return None


def _fill(depth: int, capacity: int) -> str:
    if depth >= FULL * capacity:
        return "full "
    return "empty " if depth == 0 else ""


# ---------------------------------------------------------------------------------------------- GPUs

def _utilisation(s: RunSignals, gpus: Sequence[GpuView]) -> dict[int, float]:
    """The run's GPUs (all of the target's when the run named none) -> recent mean utilisation."""
    wanted = set(s.gpus)
    util: dict[int, float] = {}
    for gpu in gpus:
        if wanted and gpu.row.index not in wanted:
            continue
        recent = gpu.utilization_history[-RECENT_SAMPLES:]
        if recent:
            util[gpu.row.index] = sum(recent) / len(recent)
        elif gpu.row.utilization_pct is not None:
            util[gpu.row.index] = gpu.row.utilization_pct
    return dict(sorted(util.items()))


def _waiting_gpus(bound_by: str, s: RunSignals, util: dict[int, float]) -> list[int]:
    """The GPUs the verdict shows waiting: the target models' when the drafter bounds, the others when the
    target does (cuda:i is the run's i-th GPU), every GPU of the run otherwise or when the split is unknown."""
    order = list(s.gpus) if s.gpus else list(util)
    n = s.n_targets
    if not n or n >= len(order) or bound_by not in (DRAFTER, TARGET):
        return list(util)
    chosen = order[:n] if bound_by == DRAFTER else order[n:]
    return [index for index in chosen if index in util]


def _gpu_evidence(indices: list[int], util: dict[int, float]) -> list[str]:
    if not indices:
        return []
    values = sorted(round(util[i]) for i in indices)
    level = f"{values[0]} %" if values[0] == values[-1] else f"{values[0]}-{values[-1]} %"
    noun = "GPU" if len(indices) == 1 else "GPUs"
    return [f"{noun} {index_ranges(indices)} at {level}"]


# ---------------------------------------------------------------------------------------------- output

def _bottleneck(bound_by: str, evidence: list[str]) -> Bottleneck:
    label = "host-bound (GPU idle)" if bound_by == HOST else f"{bound_by}-bound"
    return Bottleneck(bound_by=bound_by, evidence=f"{label}: " + ", ".join(evidence))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %"
