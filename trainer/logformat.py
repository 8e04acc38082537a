"""The trainer's log lines beside its step lines, as the seed trainer wrote them (start-up, dataset, buckets,
targets), its own additions (start-up stages, compiles, step times, `generate`'s progress), and the non-step
records of metrics.jsonl.

The step line and its metrics.jsonl record are the step record's (dflash_records/step.py: StepRecord, its
`to_line` and `to_json`), which the agent and the controller read with the same code. Torch-free on purpose:
the controller's parser is tested against these writers.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

# the step line and its metrics.jsonl record are the step record's own (dflash_records/step.py), as are the
# elapsed and ETA formats they share with the lines below
from dflash_records.step import METRICS_SCHEMA_VERSION, format_elapsed, format_eta


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
