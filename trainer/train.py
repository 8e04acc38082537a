"""Train a DFlash drafter against a frozen target: one flat script, one process per GPU (torchrun) or CPU.

    python -m trainer train --config run.yaml
    torchrun --nproc-per-node 8 -m trainer train --config run.yaml

Every rank holds its own target next to its drafter; DDP averages the gradients; rank 0 logs and writes the
checkpoints. All GPU work runs on the main thread: the batch-builder threads only slice Arrow rows on the CPU.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from trainer import logformat, memplan, optim
from trainer.config import TrainConfig, resolved_config_text
from trainer.errors import TrainerError
from trainer.startup import compile_attention, default_compile_caches, stage_line
from trainer.preflight import checked_config  # every problem of config, paths and data in one pass

STATE_FILE = "training_state.pt"
CONFIG_FILE = "trainer_config.json"  # the resolved training config, readable without torch
CHECKPOINT_FILES = ("config.json", "model.safetensors", STATE_FILE, CONFIG_FILE)
# config keys that shape the drafter or the data order: a checkpoint resumes only with the same values
RESUME_KEYS = ("block_size", "drafter_layers", "target_layer_ids", "sliding_window", "drafter_heads",
               "drafter_kv_heads", "drafter_head_dim", "drafter_intermediate_size", "drafter_rope_theta",
               "mask_token_id", "seed", "buckets", "token_budget", "max_length", "overlong")


class DraftDDP(DistributedDataParallel):
    """DDP that lets the objective read the drafter's own attributes (config, lm_head, ...) through it.

    The gradients are views into DDP's all-reduce buckets: one copy of them, not two (the memory plan's)."""

    def __init__(self, module, **options):
        super().__init__(module, **{"gradient_as_bucket_view": True, **options})

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def refuse_gpu_compile(cfg: TrainConfig) -> None:
    """compile: true is refused where it would train on a GPU, before anything loads: it was never measured to
    finish its first steps there (an 8B-shape drafter compiled whole did not get through 6 warm-up steps in
    150 s on an H200), while the eager drafter with flex_attention compiled on its own is the measured path."""
    on_gpu = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.compile and on_gpu:
        raise TrainerError("compile: true is not supported on a GPU: compiling the whole drafter was not measured "
                           "to reach its first steps (flex_attention is compiled on its own already); "
                           "remove compile or set it to false")


def anchors_per_sequence(cfg: TrainConfig, batch_size: int) -> int:
    if not cfg.anchor_budget:  # 0: no cap
        return cfg.num_anchors
    return max(1, min(cfg.num_anchors, cfg.anchor_budget // batch_size))


def lr_factor(step: int, *, total_steps: int, warmup_steps: int) -> float:
    """Linear warmup to the peak, then cosine decay to 0 at total_steps (step counts from 0)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------- checkpoints

def complete_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every step_N/ holding all its files, oldest first; temp dirs are never named step_N."""
    found = []
    for path in output_dir.glob("step_*"):
        suffix = path.name.removeprefix("step_")
        if suffix.isdigit() and all((path / name).is_file() for name in CHECKPOINT_FILES):
            found.append((int(suffix), path))
    return sorted(found)


def choose_resume_dir(cfg: TrainConfig) -> Path | None:
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        found = complete_checkpoints(Path(cfg.output_dir))
        return found[-1][1] if found else None
    path = Path(cfg.resume)
    if not all((path / name).is_file() for name in CHECKPOINT_FILES):
        raise TrainerError(f"resume: {path} is not a complete checkpoint (needs {', '.join(CHECKPOINT_FILES)})")
    return path


def check_resumable(resume_dir: Path, cfg: TrainConfig) -> None:
    saved = json.loads((resume_dir / CONFIG_FILE).read_text())
    changed = [key for key in RESUME_KEYS if saved.get(key) != getattr(cfg, key)]
    if changed:
        details = ", ".join(f"{key}: {saved.get(key)!r} -> {getattr(cfg, key)!r}" for key in changed)
        raise TrainerError(f"cannot resume from {resume_dir}: the config changed ({details}); "
                           f"use --resume never or a new output_dir")


def save_checkpoint(output_dir: Path, step: int, *, drafter, state: dict, keep: int) -> Path:
    """Write step_N/ into a temp dir and rename it: a kill mid-write never leaves a complete-looking step_N."""
    from trainer.checkpoint import save_drafter

    final = output_dir / f"step_{step}"
    temp = output_dir / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    save_drafter(drafter, temp)
    torch.save(state, temp / STATE_FILE)
    (temp / CONFIG_FILE).write_text(json.dumps(state["config"], indent=2))
    for path in temp.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(temp, final)
    if keep:
        for _, old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def rng_state(generator) -> dict:
    import numpy as np

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "anchors": generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, generator) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["anchors"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def agree_on_resume(resume_dir: Path | None, ctx) -> tuple[Path | None, bool]:
    """Rank 0's choice of checkpoint holds for the whole job, and whether this rank can read it itself.

    In a job across hosts only the first node has the checkpoints (rank 0 writes them): the other nodes must
    resume from the same step, with the state rank 0 sends them, not start fresh.
    """
    from trainer.distributed import broadcast_object

    chosen = broadcast_object(str(resume_dir) if resume_dir is not None else None, ctx)
    if chosen is None:
        return None, False
    path = Path(chosen)
    return path, (path / STATE_FILE).is_file()


def resume_state(resume_dir: Path, local: bool, ctx) -> dict:
    """The training state of the checkpoint: read from disk, or from rank 0 where this node lacks the files."""
    from trainer.distributed import any_rank, broadcast_object

    state = torch.load(resume_dir / STATE_FILE, map_location="cpu", weights_only=False) if local else None
    if any_rank(not local, ctx):  # only pay for the broadcast when some rank cannot read the checkpoint
        state = broadcast_object(state, ctx)
    return state


def gather_to_main(value, ctx) -> list:
    import torch.distributed as dist

    if not ctx.is_distributed:
        return [value]
    gathered = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


# ---------------------------------------------------------------------------------------------- logging

class MetricsLog:
    """Rank 0's step lines on stdout and the same numbers as JSON lines in {output_dir}/metrics.jsonl."""

    def __init__(self, output_dir: Path, enabled: bool):
        self.enabled = enabled
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

    def step(self, metrics: logformat.StepMetrics, **extra) -> None:
        if self.enabled:
            print(logformat.format_step_line(metrics), flush=True)
            record = json.loads(logformat.metrics_json(metrics))
            record.update(extra)
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
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


def main(config_path: str, *, resume: str | None = None) -> int:
    # ------------------------------------------------------------------ config: everything is checked before models load
    cfg = checked_config(config_path, overrides={"resume": resume} if resume else None)
    refuse_gpu_compile(cfg)
    from trainer import data as data_lib

    dataset = data_lib.open_dataset(cfg.data_path)
    layout = data_lib.layout_buckets(dataset.lengths, bounds=cfg.buckets, token_budget=cfg.token_budget,
                                     max_length=cfg.max_length, overlong=cfg.overlong)
    resume_dir = choose_resume_dir(cfg)
    if resume_dir is not None:
        check_resumable(resume_dir, cfg)

    # ------------------------------------------------------------------ distributed init
    from trainer.distributed import compute_cleanup, compute_init

    default_compile_caches()
    ctx = compute_init(cfg.device)
    try:
        return train(cfg, ctx, dataset, layout, resume_dir)
    finally:
        compute_cleanup()


def train(cfg: TrainConfig, ctx, dataset, layout, resume_dir: Path | None) -> int:
    from trainer import data as data_lib
    from trainer.checkpoint import load_drafter
    from trainer.distributed import barrier, broadcast_parameters, weights_digest
    from trainer.drafter import DFlashDrafter, DrafterConfig
    from trainer.families import drafter_shape
    from trainer.objective import dflash_step
    from trainer.target import TargetModel

    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if ctx.is_main:
        for stale in output_dir.glob(".tmp-step_*"):  # a checkpoint write that a kill interrupted
            shutil.rmtree(stale, ignore_errors=True)
    log = MetricsLog(output_dir, enabled=ctx.is_main)
    log.say("Resolved config:", *("  " + line for line in resolved_config_text(cfg).splitlines()))
    log.say(f"World: {ctx.world_size} process(es), rank 0 on {ctx.device}")
    gpu_bytes = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.device.type == "cuda" else None
    memplan.check(cfg, world_size=ctx.world_size, limit=gpu_bytes, on_gpu=gpu_bytes is not None, say=log.say)

    # ------------------------------------------------------------------ data
    per_rank = data_lib.batches_per_rank(layout, world_size=ctx.world_size)
    if per_rank == 0:
        raise TrainerError(f"the dataset gives {sum(layout.batch_counts())} batches: fewer than one per rank "
                           f"({ctx.world_size} ranks)")
    min_size, max_size, avg_size = layout.batch_size_stats()
    log.say(logformat.format_dataset_lines(dataset.path, len(dataset)))
    if layout.n_overlong:
        action = "truncated" if cfg.overlong == "truncate" else "dropped"
        log.say(logformat.format_overlong_line(layout.n_overlong, cfg.max_length, action=action))
    log.say(logformat.format_batches_line(sum(layout.batch_counts()), min_size=min_size, max_size=max_size,
                                          avg_size=avg_size),
            logformat.format_bucket_table(layout.bounds, layout.batch_counts()))
    total_steps = cfg.max_steps or cfg.epochs * per_rank

    # ------------------------------------------------------------------ model
    on_gpu = ctx.device.type == "cuda"
    dtype = {"auto": torch.bfloat16 if on_gpu else torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float32": torch.float32}[cfg.dtype]
    log.say(stage_line("loading target"), logformat.format_loading_targets(ctx.world_size),
            logformat.format_target_on(ctx.rank, str(ctx.device)))
    target = TargetModel.load(cfg.target_path, layer_ids=cfg.target_layer_ids, num_taps=len(cfg.target_layer_ids),
                              device=ctx.device, dtype=dtype, mask_token_id=cfg.mask_token_id)
    log.say(target.describe())
    log.say(stage_line("building drafter"))
    torch.manual_seed(cfg.seed)  # same init on every rank; the broadcast below makes it certain
    resume_dir, local_resume = agree_on_resume(resume_dir, ctx)
    if local_resume:
        drafter = load_drafter(resume_dir, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
                               device=ctx.device)
    else:  # a fresh run, or a rank on another node that gets rank 0's checkpointed weights by broadcast
        shape = drafter_shape(target.spec, heads=cfg.drafter_heads, kv_heads=cfg.drafter_kv_heads,
                              head_dim=cfg.drafter_head_dim, intermediate_size=cfg.drafter_intermediate_size,
                              sliding_window=cfg.sliding_window, rope_theta=cfg.drafter_rope_theta)
        drafter_config = DrafterConfig.from_target(
            target.config, num_layers=cfg.drafter_layers, block_size=cfg.block_size,
            target_layer_ids=cfg.target_layer_ids, mask_token_id=target.mask_token_id, shape=shape)
        with torch.device(ctx.device):  # initialised where it trains: an 8B-shape drafter took 15 s on the CPU
            drafter = DFlashDrafter(drafter_config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    drafter = drafter.to(device=ctx.device, dtype=torch.float32)  # fp32 master weights; autocast computes in bf16
    broadcast_parameters(drafter, ctx)
    n_params = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    shown = drafter.config
    window = f", sliding window {shown.sliding_window} on {len(shown.layer_types) - 1}" if shown.sliding_window else ""
    log.say(f"Drafter: {cfg.drafter_layers} layers, {n_params / 1e6:.2f}M trainable parameters, "
            f"{shown.num_attention_heads} heads / {shown.num_key_value_heads} KV x {shown.head_dim}, MLP "
            f"{shown.intermediate_size}{window}, mask token {shown.mask_token_id}, taps {cfg.target_layer_ids}")
    model = DraftDDP(drafter, device_ids=[ctx.device] if on_gpu else None) if ctx.is_distributed else drafter
    if cfg.compile:
        model = torch.compile(model)

    # ------------------------------------------------------------------ optimizer
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer, optimizer_line = optim.build_optimizer(params, cfg, ctx, fused=on_gpu)
    log.say(optimizer_line)
    warmup = math.ceil(cfg.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps=total_steps, warmup_steps=warmup))
    anchor_rng = torch.Generator()  # CPU: the objective draws anchors on the CPU, the same on every device
    anchor_rng.manual_seed(cfg.seed * 1009 + ctx.rank)
    step, position = 0, {"epoch": 0, "index": 0}
    if resume_dir is not None:
        state = resume_state(resume_dir, local_resume, ctx)
        optim.load_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, position = state["step"], state["data_position"]
        if len(state["rng"]) == ctx.world_size:
            restore_rng(state["rng"][ctx.rank], anchor_rng)
        log.say(f"Resumed from {resume_dir} at step {step} (epoch {position['epoch']}, batch {position['index']})")
        log.event("resume", step=step, path=str(resume_dir), data_position=position)

    # ------------------------------------------------------------------ loop
    stream = data_lib.BatchStream(
        dataset, layout, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size,
        start_epoch=position["epoch"], start_index=position["index"], max_length=cfg.max_length,
        pad_to_bucket=cfg.compile, pad_token_id=target.config.pad_token_id or 0, num_workers=cfg.num_workers,
        prefetch=cfg.prefetch, pin_memory=on_gpu)
    autocast = torch.autocast(device_type=ctx.device.type, dtype=dtype, enabled=on_gpu and dtype != torch.float32)
    if on_gpu and not cfg.compile:  # compile: true traces flex_attention inside the drafter's own graph
        compile_attention(drafter, feature_dtype=dtype, autocast=autocast, say=log.say,
                          single_sequence_batches=min_size == 1)
    log.say(stage_line("first step"))
    meter = Throughput(ctx.device)
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, acc, streak of the interval
    started, start_step = time.perf_counter(), step
    log.event("start", step=step, total_steps=total_steps, world_size=ctx.world_size)

    def write_checkpoint() -> None:
        began = time.perf_counter()
        rngs = gather_to_main(rng_state(anchor_rng), ctx)
        optimizer_state = optim.full_state(optimizer, ctx)  # every rank: a sharded state is gathered to rank 0
        if ctx.is_main:
            state = {"step": step, "optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                     "rng": rngs, "data_position": stream.position(), "config": cfg.model_dump(),
                     "world_size": ctx.world_size}
            path = save_checkpoint(output_dir, step, drafter=drafter, state=state, keep=cfg.keep_checkpoints)
            log.event("checkpoint", step=step, path=str(path))
        barrier(ctx)
        meter.started += time.perf_counter() - began  # saving is not training: keep it out of tok/s

    try:
        while step < total_steps:
            graphs_before, step_began = compiled_graphs(), time.perf_counter()
            batch = next(stream)
            input_ids = batch.input_ids.to(ctx.device, non_blocking=True)
            loss_mask = batch.loss_mask.to(ctx.device, non_blocking=True)
            t0 = meter.mark()
            with autocast:
                # the CPU mask: features() sees the right padding there and runs the unmasked causal kernel
                features = target.features(input_ids, batch.attention_mask)
            t1 = meter.mark()
            n_anchors = anchors_per_sequence(cfg, len(input_ids))
            with autocast:
                out = dflash_step(model, features, input_ids, loss_mask, num_anchors=n_anchors,
                                  block_size=cfg.block_size, gamma=cfg.gamma, noise=cfg.noise, generator=anchor_rng)
            out.loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            meter.add(t0, t1, meter.mark(), batch.n_tokens)
            graphs = compiled_graphs()
            if graphs > graphs_before:  # say why this step was slow: it is not a hang
                log.say(logformat.format_compiled_line(
                    step, graphs=graphs - graphs_before, total=graphs, seconds=time.perf_counter() - step_began,
                    batch=len(input_ids), seq_len=input_ids.shape[1], blocks=len(input_ids) * n_anchors))
            # metrics stay on the device; they are read once per log interval, not every step
            sums += torch.stack([out.loss.detach(), out.acc, out.streak]).double()
            if step % cfg.log_every == 0 or step == total_steps or step == start_step + 1:
                epoch = batch.epoch + (batch.index + 1) / per_rank
                log_step(log, meter, sums, ctx, cfg, step=step, total_steps=total_steps, lr=lr, epoch=epoch,
                         elapsed=time.perf_counter() - started, q_pre=[stream.queue_depth()], batch=batch)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total_steps:
                write_checkpoint()
        if step > start_step:  # a run resumed from its last step has nothing new to save
            write_checkpoint()
    finally:
        stream.close()
    digest = weights_digest(drafter)
    # one write per line: every rank prints this, and print() writes the newline separately
    sys.stdout.write(f"rank {ctx.rank} drafter weights digest {digest}\n")
    sys.stdout.flush()
    log.event("finished", step=step, digest=digest)
    log.say(f"Finished: {step} steps in {time.perf_counter() - started:.1f}s; checkpoint {output_dir}/step_{step}")
    log.close()
    return 0


def log_step(log: MetricsLog, meter: Throughput, sums, ctx, cfg: TrainConfig, *, step: int, total_steps: int,
             lr: float, epoch: float, elapsed: float, q_pre: list[int], batch) -> None:
    """Average the interval over steps and ranks (one small all-reduce, on log steps only) and write it."""
    import torch.distributed as dist

    from trainer.distributed import all_reduce_sum

    steps = meter.steps
    totals = sums.clone()
    if ctx.is_distributed:
        dist.all_reduce(totals)
    loss, acc, streak = (totals / (steps * ctx.world_size)).tolist()
    target_s, drafter_s, wall_s = meter.seconds()
    tokens = all_reduce_sum(float(meter.tokens), ctx)
    seconds_per_step = wall_s / steps
    metrics = logformat.StepMetrics(
        elapsed_s=elapsed, step=step, loss=loss, acc=acc, streak=streak, lr=lr, noise=cfg.noise,
        tgt_batches_per_s=steps / target_s if target_s > 0 else 0.0,
        dft_batches_per_s=steps / drafter_s if drafter_s > 0 else 0.0,
        tok_per_s=tokens / wall_s if wall_s > 0 else 0.0, q_pre=q_pre, q_hs=[], epoch=epoch,
        eta_s=(total_steps - step) * seconds_per_step)
    log.step(metrics, data_position=[batch.epoch, batch.index], world_size=ctx.world_size)
    sums.zero_()
    meter.reset()
