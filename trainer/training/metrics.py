"""What a training run reports: rank 0's step lines on stdout and the same numbers in metrics.jsonl, the
per-interval throughput meter (CUDA events, read only when a line is written), and how many frames
torch.compile has compiled (a slow step that compiled says so)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from dflash_records.step import TAU_FIELDS, StepRecord
from trainer import logformat
from trainer.config import TrainConfig
from trainer.training.reporting import numbers_of


class MetricsLog:
    """Rank 0's step lines on stdout and the same numbers as JSON lines in {output_dir}/metrics.jsonl."""

    def __init__(self, output_dir: Path, enabled: bool, reporters: list | None = None):
        self.enabled = enabled
        self.reporters = list(reporters or []) if enabled else []  # trainer/training/reporting.py
        self.file = open(output_dir / "metrics.jsonl", "a") if enabled else None
        if enabled:
            link_into_run_dir(output_dir / "metrics.jsonl")

    def say(self, *lines: str) -> None:
        if self.enabled:
            for line in lines:
                print(line, flush=True)

    def event(self, event: str, **fields) -> None:
        if self.enabled:
            self.file.write(logformat.event_json(event, **fields) + "\n")
            self.file.flush()

    def step(self, metrics: StepRecord, **extra) -> None:
        if self.enabled:
            print(metrics.to_line(), flush=True)
            line = metrics.to_json(**extra)
            self.file.write(line + "\n")
            self.file.flush()
            for reporter in self.reporters:
                reporter.step(metrics.step, numbers_of(json.loads(line)))

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()
        self.reporters = []
        if self.file:
            self.file.close()


def link_into_run_dir(metrics: Path) -> None:
    """Under a launcher that gives each run a directory (DFLASH_RUN_DIR), make metrics.jsonl visible there too,
    where run tools look for it, without writing it twice."""
    run_dir = os.environ.get("DFLASH_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return
    link = Path(run_dir) / "metrics.jsonl"
    if link.resolve() != metrics.resolve() and not os.path.lexists(link):
        os.symlink(metrics.resolve(), link)


def timing_mark(cuda: bool):
    """A point in the step: a CUDA event on a GPU (read later, so no step waits for the GPU), else a clock."""
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def seconds_between(start, end) -> float:
    """Seconds between two timing marks of the same kind."""
    return start.elapsed_time(end) / 1000 if isinstance(start, torch.cuda.Event) else end - start


def compiled_graphs() -> int:
    """Frames torch.compile has compiled in this process so far (flex_attention and its mask builder count)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo
        return 0
    return int(counters["frames"].get("total", 0))


class Throughput:
    """Per log interval: seconds spent in the target and in the drafter step, tokens and wall time.

    On a GPU the split uses CUDA events read only at log time, so steps never wait for the GPU to finish."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.marks: list[tuple] = []
        self.tokens = 0
        self.steps = 0
        self.started = time.perf_counter()

    def mark(self):
        return timing_mark(self.cuda)

    def add(self, start, after_target, end, tokens: int) -> None:
        self.marks.append((start, after_target, end))
        self.tokens += tokens
        self.steps += 1

    def seconds(self) -> tuple[float, float, float]:
        """(target seconds, drafter seconds, wall seconds) of the interval."""
        if self.cuda:
            self.marks[-1][2].synchronize()
        target = sum(seconds_between(a, b) for a, b, _ in self.marks)
        drafter = sum(seconds_between(b, c) for _, b, c in self.marks)
        return target, drafter, time.perf_counter() - self.started


def log_step(log: MetricsLog, meter: Throughput, sums, ctx, cfg: TrainConfig, *, step: int, total_steps: int,
             lr: float, epoch: float, elapsed: float, q_pre: list[int], batch, phases: "PhaseMeter | None" = None,
             taus: dict | None = None, term_names: list[str] = ()) -> None:
    """Average the interval over steps and ranks (one small all-reduce, on log steps only) and write it.
    `taus`: the τ fields measured at this step (trainer/training/tau_monitor.py); histograms go to metrics.jsonl
    only. `sums` holds loss, acc, streak, then one sum per objective term (`term_names`), which metrics.jsonl
    gets as loss_<term>."""
    import torch.distributed as dist

    from trainer.training.distributed import all_reduce_sum

    steps = meter.steps
    totals = sums.clone()
    if ctx.is_distributed:
        dist.all_reduce(totals)
    loss, acc, streak, *term_values = (totals / (steps * ctx.world_size)).tolist()
    target_s, drafter_s, wall_s = meter.seconds()
    tokens = all_reduce_sum(float(meter.tokens), ctx)
    seconds_per_step = wall_s / steps
    metrics = StepRecord(
        elapsed_s=elapsed, step=step, loss=loss, acc=acc, streak=streak, lr=lr, noise=cfg.noise,
        tgt_batches_per_s=steps / target_s if target_s > 0 else 0.0,
        dft_batches_per_s=steps / drafter_s if drafter_s > 0 else 0.0,
        tok_per_s=tokens / wall_s if wall_s > 0 else 0.0, q_pre=q_pre, q_hs=[], epoch=epoch,
        eta_s=(total_steps - step) * seconds_per_step,
        **{name: (taus or {}).get(name) for name in TAU_FIELDS})
    times, times_line = step_time_fields(phases, wall_s, steps) if phases is not None else ({}, None)
    extra = {key: value for key, value in (taus or {}).items() if key not in TAU_FIELDS}
    extra.update({f"loss_{name}": value for name, value in zip(term_names, term_values)})
    log.step(metrics, data_position=[batch.epoch, batch.index], world_size=ctx.world_size, **times, **extra)
    if times_line is not None:
        log.say(times_line)
        phases.reset()
    sums.zero_()
    meter.reset()


class PhaseMeter:
    """Per log interval: where each step's time went (data wait, target, drafter forward+backward, optimizer,
    exposed gradient all-reduce), so the dashboard can name the bound exactly. GPU phases come from the same
    kind of timing marks as Throughput's and are read only when a line is written."""

    def __init__(self, device, ddp=None):
        self.cuda = device.type == "cuda"
        self.ddp = ddp  # the DistributedDataParallel wrapper of a multi-rank run: it measures its own all-reduce
        self.reset()

    def reset(self) -> None:
        self.data_s = 0.0
        self.marks: list[tuple] = []

    def waited(self, seconds: float) -> None:
        """Host seconds the loop spent waiting for its next batch."""
        self.data_s += seconds

    def add(self, start, after_target, after_drafter, end) -> None:
        self.marks.append((start, after_target, after_drafter, end))

    def per_step(self) -> dict[str, float | None]:
        """Seconds per step of each phase over the interval (call after Throughput.seconds(), which waits for
        the interval's last mark)."""
        steps = max(1, len(self.marks))
        totals = [sum(seconds_between(m[i], m[i + 1]) for m in self.marks) / steps for i in range(3)]
        comm = self.comm_seconds()
        drafter = totals[1] if comm is None else max(0.0, totals[1] - comm)
        return {"data": self.data_s / steps, "target": totals[0], "drafter": drafter, "optimizer": totals[2],
                "comm": comm}

    def comm_seconds(self) -> float | None:
        """The gradient all-reduce time not hidden behind the backward, per step, as DDP samples it itself
        (a running average over its sampled iterations); None for a single-rank run or before DDP has a sample."""
        if self.ddp is None:
            return None
        try:
            stats = self.ddp._get_ddp_logging_data()
        except (AttributeError, RuntimeError):
            return None
        comm, overlap = stats.get("avg_backward_comm_time"), stats.get("avg_backward_compute_comm_overlap_time")
        if not comm:
            return None
        return max(0.0, comm - (overlap or 0)) / 1e9


def step_time_fields(phases: PhaseMeter, wall_s: float, steps: int) -> tuple[dict, str]:
    """The interval's per-step phase times as metrics.jsonl keys (`data_s`, ..., `step_s`) and as the human line
    printed after the step line."""
    seconds = phases.per_step()
    wall = wall_s / max(1, steps)
    fields = {f"{name}_s": value for name, value in seconds.items()}
    fields["step_s"] = wall
    return fields, logformat.format_step_times_line(seconds, wall_s=wall)
