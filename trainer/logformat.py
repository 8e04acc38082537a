"""The trainer's log format: human lines as the seed trainer wrote them, and one JSON object per step line.

Torch-free on purpose: the controller's parser imports this module and is tested against it.

Time formats (chosen so a reader sees the right unit at a glance, and a parser needs no lookahead):
- elapsed, in brackets: under a minute `[42s]`, under an hour whole minutes `[6m]` (floored, as the seed
  trainer printed them), from an hour on `[3h07m]`.
- ETA: one decimal in the largest unit that keeps the number at least 1: seconds under a minute (`45.0s`),
  minutes under an hour (`12.5m`), hours under a day (`5.2h`), days from then on (`12.0d`); `?` when unknown.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence

METRICS_SCHEMA_VERSION = 1


@dataclass
class StepMetrics:
    elapsed_s: float
    step: int
    loss: float
    acc: float
    streak: float
    lr: float
    noise: float
    tgt_batches_per_s: float
    dft_batches_per_s: float
    tok_per_s: float
    q_pre: list[int] = field(default_factory=list)
    q_hs: list[int] = field(default_factory=list)
    epoch: float = 0.0
    eta_s: float | None = None
    # τ predicted from replayed decoding rounds (trainer/training/tau_replay.py), present only where measured: on the
    # step's own batch, on the held-out split (eval_every), and from real speculative decoding of held-out prompts
    tau_replay: float | None = None
    tau_heldout: float | None = None
    tau_eval: float | None = None
    # DDTree rounds replayed on the held-out split, per node budget (trainer/training/tree_replay.py)
    tau_tree_heldout: dict[int, float] | None = None


TAU_FIELDS = ("tau_replay", "tau_heldout", "tau_eval", "tau_tree_heldout")


def format_elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 300:
        # the seed format's whole minutes hide most of the first minutes (`[1m]` from 60 to 119 s)
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    for unit, size, limit in (("s", 1, 60), ("m", 60, 3600), ("h", 3600, 86400)):
        if seconds < limit:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds / 86400:.1f}d"


def _format_queue(depths: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in depths) + "]"


def format_step_line(m: StepMetrics) -> str:
    """One step line, e.g. the seed's
    `[6m] step=8 loss=12.5546 acc=0.025 streak=0.0 lr=4.52e-06 noise=0.0003 | tgt=0.34b/s dft=0.29b/s
    (11.7Ktok/s) | q_pre=[50, 50] q_hs=[15] | epoch~0.01 ETA=12.0d` (on one line), then, an addition to the
    seed format, the τ figures measured at this step: ` | tau_replay=1.84 tau_heldout=1.79 tau_eval=1.81
    tau_tree_heldout=8:2.41,32:2.93,64:3.02` (tree τ per node budget, `budget:τ` joined by commas)."""
    return _format_seed_step(m) + format_tau_suffix(m)


def format_tau_suffix(m: StepMetrics) -> str:
    """` | tau_replay=1.84 ...` with the τ fields that were measured, or nothing."""
    shown = [f"{name}={_format_tau(getattr(m, name))}" for name in TAU_FIELDS if getattr(m, name) is not None]
    return " | " + " ".join(shown) if shown else ""


def _format_tau(value: float | dict[int, float]) -> str:
    # three decimals always: a reader tells a whole value from one cut short by the log's end
    if isinstance(value, dict):
        return ",".join(f"{int(budget)}:{tau:.3f}" for budget, tau in sorted(value.items()))
    return f"{value:.3f}"


def _format_seed_step(m: StepMetrics) -> str:
    return (
        f"[{format_elapsed(m.elapsed_s)}] step={m.step} loss={m.loss:.4f} acc={m.acc:.3f} "
        f"streak={m.streak:.1f} lr={m.lr:.2e} noise={m.noise:g} | "
        f"tgt={m.tgt_batches_per_s:.2f}b/s dft={m.dft_batches_per_s:.2f}b/s "
        f"({m.tok_per_s / 1000:.1f}Ktok/s) | "
        f"q_pre={_format_queue(m.q_pre)} q_hs={_format_queue(m.q_hs)} | "
        f"epoch~{m.epoch:.2f} ETA={format_eta(m.eta_s)}"
    )


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def metrics_json(m: StepMetrics) -> str:
    """One line of metrics.jsonl: the StepMetrics fields plus `"event": "step"` (NaN becomes null: strict JSON)."""
    record = {"event": "step", "v": METRICS_SCHEMA_VERSION}
    record.update({key: _finite_or_none(value) for key, value in asdict(m).items()
                   if key not in TAU_FIELDS or value is not None})
    return json.dumps(record, separators=(", ", ": "))


def event_json(event: str, **fields) -> str:
    """A non-step line of metrics.jsonl (start, checkpoint, finished)."""
    record = {"event": event, "v": METRICS_SCHEMA_VERSION}
    record.update(fields)
    return json.dumps(record, separators=(", ", ": "), default=str)


def format_dataset_lines(path: str, n_samples: int) -> str:
    return f"Loading dataset from {path}...\n  {n_samples} samples loaded (Arrow-backed, lazy access)"


def format_overlong_line(n_overlong: int, max_length: int, *, action: str) -> str:
    """An addition to the seed format: how many samples exceeded max_length, and what was done to them."""
    return f"  {n_overlong} samples longer than max_length={max_length} ({action})"


def format_batches_line(n_batches: int, *, min_size: int, max_size: int, avg_size: float) -> str:
    return f"Batches per epoch: {n_batches} (min={min_size} max={max_size} avg={avg_size:.1f})"


def format_bucket_table(bounds: Sequence[int], batch_counts: Sequence[int]) -> str:
    """One line per bucket [bounds[i], bounds[i+1]) with its batch count and share, then a blank line."""
    total = sum(batch_counts) or 1
    lines = [
        f"  Bucket {i} [{bounds[i]:4d},{bounds[i + 1]:4d}): {count:6d} batches ({100.0 * count / total:5.1f}%)"
        for i, count in enumerate(batch_counts)
    ]
    return "\n".join(lines) + "\n"


def format_startup_line(elapsed_s: float, stage: str) -> str:
    """A start-up stage as it begins, with the seconds since the process started, e.g.
    `Start-up [41.2s]: compiling 1/2 (flex_attention, full_attention layers)`. The stages: loading target,
    building drafter, compiling k/n, first step. A run that compiles is never mistaken for a hung one."""
    return f"Start-up [{elapsed_s:.1f}s]: {stage}"


def format_compiled_line(step: int, *, graphs: int, total: int, seconds: float, batch: int, seq_len: int,
                         blocks: int) -> str:
    """After a step that compiled: what it compiled for, and how long the step took on the host."""
    return (f"  step {step} compiled {graphs} graph(s) for a {batch}x{seq_len} batch with {blocks} blocks "
            f"in a {seconds:.1f}s step ({total} compiled so far)")


def format_loading_targets(n_targets: int) -> str:
    return f"Loading {n_targets} target models..."


def format_target_on(index: int, device: str) -> str:
    return f"  Target {index} on {device}..."


def format_generate_line(elapsed_s: float, *, answered: int, total: int, failed: int, tok_per_s: float,
                         prompts_per_s: float, eta_s: float | None) -> str:
    """`generate`'s progress, e.g. `[6m] generate answered=1200/100000 failed=3 | 1.9Ktok/s 3.33prompts/s |
    ETA=9.1h` (on one line): answered counts the prompts a resumed run skipped too, the rates are this run's."""
    tokens = f"{tok_per_s / 1000:.1f}Ktok/s" if tok_per_s >= 1000 else f"{tok_per_s:.1f}tok/s"  # a CPU's rate too
    return (f"[{format_elapsed(elapsed_s)}] generate answered={answered}/{total} failed={failed} | "
            f"{tokens} {prompts_per_s:.2f}prompts/s | ETA={format_eta(eta_s)}")


STEP_TIME_PHASES = ("data", "target", "drafter", "optimizer", "comm")


def format_step_times_line(seconds: dict[str, float | None], *, wall_s: float) -> str:
    """Where a step's time went, averaged over the log interval, printed after the step line, e.g.
    `  step times: data 0.003s, target 0.180s, drafter 0.200s, optimizer 0.009s, comm 0.020s, wall 0.420s`.
    data: the loop waiting for its next batch; drafter: forward and backward (without the exposed gradient
    all-reduce, which is comm); a phase not measured is left out. What wall holds beyond the phases is host time
    with the GPU idle."""
    parts = [f"{name} {seconds[name]:.3f}s" for name in STEP_TIME_PHASES if seconds.get(name) is not None]
    return "  step times: " + ", ".join(parts + [f"wall {wall_s:.3f}s"])
