"""Train a DFlash drafter against a frozen target: one flat script, one process per GPU (torchrun) or CPU.

    python -m trainer train --config run.yaml
    torchrun --nproc-per-node 8 -m trainer train --config run.yaml

Every rank holds its own target next to its drafter; DDP averages the gradients; rank 0 logs and writes the
checkpoints. All GPU work runs on the main thread: the batch-builder threads only slice Arrow rows on the CPU.
"""
from __future__ import annotations

import functools
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from trainer import logformat
from trainer.config import TrainConfig, resolved_config_text
from trainer.data.batches import BatchStream, batches_per_rank, layout_buckets, open_dataset
from trainer.errors import TrainerError
from trainer.model import kernels as kernel_lib
from trainer.planning import memory_plan
from trainer.planning.preflight import checked_config  # every problem of config, paths and data in one pass
from trainer.training import optim
from trainer.training.checkpoint_space import DiskFull
from trainer.training.checkpoints import (agree_on_resume, check_resumable, choose_resume_dir, gather_to_main,
                                          restore_rng, resume_state, rng_state, save_checkpoint)
from trainer.training.compile_warmup import (compile_attention, compile_block_conv_shapes, compile_loss_chunks,
                                             compile_target_layers, conv_shapes)
from trainer.training.drafter_setup import build_drafter
from trainer.training.metrics import MetricsLog, PhaseMeter, Throughput, compiled_graphs, log_step
from trainer.training.reporting import open_reporters, run_name
from trainer.training.startup import default_compile_caches, stage_line


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


def main(config_path: str, *, resume: str | None = None, base_dir: str | None = None) -> int:
    # ------------------------------------------------------------------ config: everything is checked before models load
    cfg = checked_config(config_path, overrides={"resume": resume} if resume else None, base_dir=base_dir)
    refuse_gpu_compile(cfg)
    dataset = open_dataset(cfg.data_path)
    layout = layout_buckets(dataset.lengths, bounds=cfg.buckets, token_budget=cfg.token_budget,
                            max_length=cfg.max_length, overlong=cfg.overlong)
    resume_dir = choose_resume_dir(cfg)
    if resume_dir is not None:
        check_resumable(resume_dir, cfg)

    # ------------------------------------------------------------------ distributed init
    from trainer.training.distributed import compute_cleanup, compute_init

    default_compile_caches()
    ctx = compute_init(cfg.device)
    try:
        return train(cfg, ctx, dataset, layout, resume_dir)
    finally:
        compute_cleanup()


def open_output(cfg: TrainConfig, ctx) -> tuple[Path, MetricsLog]:
    """The output directory (a checkpoint write a kill interrupted is removed) and the run's log, which opens
    with the resolved config and the memory plan (refused here, before loading, when it cannot fit)."""
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if ctx.is_main:
        for stale in output_dir.glob(".tmp-step_*"):
            shutil.rmtree(stale, ignore_errors=True)
    config_text = resolved_config_text(cfg)
    reporters = (open_reporters(cfg.report_to, output_dir=output_dir, config=cfg.model_dump(),
                                config_text=config_text) if ctx.is_main else [])
    log = MetricsLog(output_dir, enabled=ctx.is_main, reporters=reporters)
    log.say("Resolved config:", *("  " + line for line in config_text.splitlines()))
    if reporters:
        log.say(f"Reporting to {', '.join(cfg.report_to)} as {run_name(output_dir)}")
    log.say(f"World: {ctx.world_size} process(es), rank 0 on {ctx.device}")
    gpu_bytes = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.device.type == "cuda" else None
    memory_plan.check(cfg, world_size=ctx.world_size, limit=gpu_bytes, on_gpu=gpu_bytes is not None, say=log.say,
                      kernels=kernel_lib.resolve(cfg.kernels, ctx.device))
    return output_dir, log


def describe_data(log: MetricsLog, cfg: TrainConfig, ctx, dataset, layout) -> tuple[int, int]:
    """Log the dataset and its batches; (batches per rank per epoch, the smallest batch size)."""
    per_rank = batches_per_rank(layout, world_size=ctx.world_size)
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
    return per_rank, min_size


def run_dtype(cfg: TrainConfig, ctx) -> torch.dtype:
    """The target's weights and the autocast dtype: bf16 on a GPU and fp32 on a CPU unless the config says."""
    on_gpu = ctx.device.type == "cuda"
    return {"auto": torch.bfloat16 if on_gpu else torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16, "float32": torch.float32}[cfg.dtype]


def build_optimization(cfg: TrainConfig, ctx, log: MetricsLog, drafter, *, total_steps: int,
                       resume_dir: Path | None, local_resume: bool):
    """(params, optimizer, scheduler, anchor generator, step, data position), restored from `resume_dir`."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer, optimizer_line = optim.build_optimizer(params, cfg, ctx, fused=ctx.device.type == "cuda")
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
    return params, optimizer, scheduler, anchor_rng, step, position


def _save_or_refusal(cfg: TrainConfig, log: MetricsLog, output_dir: Path, step: int, *, drafter,
                     state: dict) -> DiskFull | None:
    """Save step_N/ (rank 0), or say in the log why the disk had no room for it and return that refusal; the
    caller stops the run for it when `on_disk_full: stop`."""
    try:
        path = save_checkpoint(output_dir, step, drafter=drafter, state=state, keep=cfg.keep_checkpoints,
                               save_dtype=cfg.save_dtype)
    except DiskFull as exc:
        then = "stopping (on_disk_full: stop)" if cfg.on_disk_full == "stop" else \
            "training goes on; the last complete checkpoint stays (on_disk_full: skip)"
        log.say(f"Checkpoint of step {step} not saved: {exc}; {then}")
        log.event("checkpoint_refused", step=step, reason=str(exc))
        return exc
    log.event("checkpoint", step=step, path=str(path))
    return None


def check_served_parity(log: MetricsLog, cfg: TrainConfig, checkpoint: Path, step: int) -> None:
    """The last checkpoint against its target, as a server will pair them (trainer/planning/parity.py): one line per
    check in the log, and a `parity` event."""
    from trainer.planning.parity import check_parity

    try:
        report = check_parity(cfg.target_path, checkpoint)
    except Exception as exc:  # noqa: BLE001 - the run is done and saved: a check that cannot run must not fail it
        log.say(f"Parity check not run: {exc}")
        return
    log.say(*report.lines())
    log.event("parity", step=step, ok=report.ok, failed=[check.key for check in report.failed])


def objective_line(objective) -> str:
    """What the start-up line says of the loss: the objective and how its logits are held."""
    if objective.is_plain_ce:
        return "chunked cross-entropy (logits in the head's dtype)"
    extra = "; the target's last layers and LM head run for p" if objective.needs_target_distribution else ""
    return f"{objective.describe()}, chunked by whole blocks{extra}"


def train(cfg: TrainConfig, ctx, dataset, layout, resume_dir: Path | None) -> int:
    """Set up (each part above) and run the loop."""
    from trainer.model.cpu_threads import one_thread_for_a_small_model
    from trainer.model.target import TargetModel
    from trainer.training.distributed import any_rank, barrier, rank_share, weights_digest
    from trainer.training.losses import Objective
    from trainer.training.objective import dflash_step

    output_dir, log = open_output(cfg, ctx)
    objective = Objective.from_config(cfg)
    count_share = functools.partial(rank_share, ctx=ctx)   # every rank's loss over the global batch's counts
    per_rank, min_size = describe_data(log, cfg, ctx, dataset, layout)
    total_steps = cfg.max_steps or cfg.epochs * per_rank
    on_gpu, dtype = ctx.device.type == "cuda", run_dtype(cfg, ctx)
    log.say(stage_line("loading target"), logformat.format_loading_targets(ctx.world_size),
            logformat.format_target_on(ctx.rank, str(ctx.device)))
    kernels = kernel_lib.resolve(cfg.kernels, ctx.device)
    target = TargetModel.load(cfg.target_path, layer_ids=cfg.target_layer_ids, num_taps=len(cfg.target_layer_ids),
                              device=ctx.device, dtype=dtype, mask_token_id=cfg.mask_token_id,
                              packing=cfg.pack_target, precision=cfg.target_precision)
    log.say(target.describe())
    one_thread_for_a_small_model(target.hidden_size, ctx.device, log.say, command="train")
    log.say(stage_line("building drafter"))
    resume_dir, local_resume = agree_on_resume(resume_dir, ctx)
    drafter = build_drafter(cfg, ctx, log, target, resume_dir if local_resume else None)
    shapes = conv_shapes(layout.batch_sizes, functools.partial(anchors_per_sequence, cfg), cfg.block_size)
    conv = kernel_lib.compile_block_convs(drafter, ctx.device, shapes=shapes)   # DFlash2: per bucket shape
    compile_target = target.compiles_layers(cfg.compile_target)
    if compile_target:   # around the target's own torch modules, not liger's kernels
        target.compile_layers()
        target_kernels = "target layers: torch.compile"
    else:
        target_kernels = kernel_lib.install_target(target.hf_model, kernels)
    drafter_kernels = kernel_lib.install_drafter(drafter, kernels)
    log.say(f"Kernels: {target.packing_line()}; {target_kernels}; {drafter_kernels}; "
            f"{conv + '; ' if conv else ''}loss: {objective_line(objective)}")
    model = DraftDDP(drafter, device_ids=[ctx.device] if on_gpu else None) if ctx.is_distributed else drafter
    phases = PhaseMeter(ctx.device, ddp=model if ctx.is_distributed else None)
    if cfg.compile:
        model = torch.compile(model)
    params, optimizer, scheduler, anchor_rng, step, position = build_optimization(
        cfg, ctx, log, drafter, total_steps=total_steps, resume_dir=resume_dir, local_resume=local_resume)

    # ------------------------------------------------------------------ loop
    stream = BatchStream(
        dataset, layout, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size,
        start_epoch=position["epoch"], start_index=position["index"], max_length=cfg.max_length,
        pad_to_bucket=cfg.compile, pad_token_id=target.config.pad_token_id or 0, num_workers=cfg.num_workers,
        prefetch=cfg.prefetch, pin_memory=on_gpu)
    autocast = torch.autocast(device_type=ctx.device.type, dtype=dtype, enabled=on_gpu and dtype != torch.float32)
    if on_gpu and not cfg.compile:  # compile: true traces flex_attention inside the drafter's own graph
        compile_attention(drafter, feature_dtype=dtype, autocast=autocast, say=log.say,
                          single_sequence_batches=min_size == 1)
        compile_block_conv_shapes(drafter, shapes, feature_dtype=dtype, autocast=autocast, say=log.say)
        compile_loss_chunks(drafter, objective, say=log.say)
    if compile_target:
        compile_target_layers(target, autocast=autocast, say=log.say)
    from trainer.training.tau_monitor import TauMonitor

    monitor = TauMonitor(cfg, ctx, target, drafter, autocast=autocast,
                         width=anchors_per_sequence(cfg, max(1, cfg.replay_sequences)))
    log.say(stage_line("first step"))
    meter = Throughput(ctx.device)
    terms = list(objective.weights)
    sums = torch.zeros(3 + len(terms), dtype=torch.float64, device=ctx.device)  # loss, acc, streak, each term
    started, start_step = time.perf_counter(), step
    log.event("start", step=step, total_steps=total_steps, world_size=ctx.world_size)

    def write_checkpoint() -> None:
        began, refused = time.perf_counter(), None
        rngs = gather_to_main(rng_state(anchor_rng), ctx)
        optimizer_state = optim.full_state(optimizer, ctx)  # every rank: a sharded state is gathered to rank 0
        if ctx.is_main:
            state = {"step": step, "optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                     "rng": rngs, "data_position": stream.position(), "config": cfg.model_dump(),
                     "world_size": ctx.world_size}
            refused = _save_or_refusal(cfg, log, output_dir, step, drafter=drafter, state=state)
        if any_rank(ctx.is_main and refused is not None and cfg.on_disk_full == "stop", ctx):
            raise refused or TrainerError("rank 0 found no room for a checkpoint (its log says where)")
        barrier(ctx)
        meter.started += time.perf_counter() - began  # saving is not training: keep it out of tok/s

    try:
        while step < total_steps:
            graphs_before, step_began = compiled_graphs(), time.perf_counter()
            batch = next(stream)
            phases.waited(time.perf_counter() - step_began)
            input_ids = batch.input_ids.to(ctx.device, non_blocking=True)
            loss_mask = batch.loss_mask.to(ctx.device, non_blocking=True)
            t0 = meter.mark()
            with autocast:
                # the CPU mask: features() reads the right padding on the host and packs the batch (or runs the
                # unmasked causal kernel where it does not pack), without waiting for the GPU
                features = target.features(input_ids, batch.attention_mask,
                                           final=objective.needs_target_distribution)
                features, target_hidden = features if objective.needs_target_distribution else (features, None)
            t1 = meter.mark()
            n_anchors = anchors_per_sequence(cfg, len(input_ids))
            with autocast:
                out = dflash_step(model, features, input_ids, loss_mask, num_anchors=n_anchors,
                                  block_size=cfg.block_size, gamma=cfg.gamma, noise=cfg.noise, generator=anchor_rng,
                                  objective=objective, target_hidden=target_hidden, count_share=count_share)
            out.loss.backward()
            t2 = meter.mark()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            t3 = meter.mark()
            meter.add(t0, t1, t3, batch.n_tokens)
            phases.add(t0, t1, t2, t3)
            graphs = compiled_graphs()
            if graphs > graphs_before:  # say why this step was slow: it is not a hang
                log.say(logformat.format_compiled_line(
                    step, graphs=graphs - graphs_before, total=graphs, seconds=time.perf_counter() - step_began,
                    batch=len(input_ids), seq_len=input_ids.shape[1], blocks=len(input_ids) * n_anchors))
            # metrics stay on the device; they are read once per log interval, not every step
            sums += torch.stack([out.loss.detach(), out.acc, out.streak,
                                 *(out.terms[name] for name in terms)]).double()
            if step % cfg.log_every == 0 or step == total_steps or step == start_step + 1 or monitor.eval_due(step):
                epoch = batch.epoch + (batch.index + 1) / per_rank
                measuring = time.perf_counter()
                taus = monitor.measure(step, features, input_ids, loss_mask, last=step == total_steps)
                meter.started += time.perf_counter() - measuring  # measuring is not training: not in tok/s
                log_step(log, meter, sums, ctx, cfg, step=step, total_steps=total_steps, lr=lr, epoch=epoch,
                         elapsed=time.perf_counter() - started, q_pre=[stream.queue_depth()], batch=batch,
                         phases=phases, taus=taus, term_names=terms)
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
    if ctx.is_main and (output_dir / f"step_{step}").is_dir():
        check_served_parity(log, cfg, output_dir / f"step_{step}", step)
    saved = (f"checkpoint {output_dir}/step_{step}" if (output_dir / f"step_{step}").is_dir()
             else "no checkpoint of the last step (no room on the disk: see above)")
    log.say(f"Finished: {step} steps in {time.perf_counter() - started:.1f}s; {saved}")
    log.close()
    # the ranks leave together: a rank that tore its process group down while rank 0 still checked parity died
    # of SIGABRT at exit once in a CI run (a restarted job's worker, gloo), and the job was failed for it
    barrier(ctx)
    return 0
