"""Trainer throughput on one device, in one process: matrix-product peak, the target's feature pass alone, and
the full training step (target features + drafter forward/backward + optimizer), with model FLOPs utilisation,
peak memory, the share of step time per phase and the compiles that happen after warm-up.

The target is random-initialised at a real shape (its layers past the last tap are never built); the batches
are synthetic chats laid out in the trainer's length buckets and served by the trainer's own BatchStream.

    python bench/bench_train.py --model qwen3-8b                          # one GPU
    python bench/bench_train.py --model qwen3-8b --compile
    torchrun --nproc-per-node 2 bench/bench_train.py --model qwen3-8b     # DDP over two GPUs
    python bench/bench_train.py --tiny --device cpu --steps 3 --json      # CPU smoke test
    python bench/bench_train.py --model qwen3.6-27b --token-budget 24576 --anchor-budget 1536 --simulate-shards 8
    python bench/bench_train.py --model qwen3-8b --block-size 8 --architecture dflash,dflash2   # DFlash2's cost
    python bench/bench_train.py --model qwen3-8b --skip-baselines --objectives ce,ce+dpace,cap,kl,lk_hybrid

--simulate-shards N checks the memory plan of one rank of an N-GPU run on one GPU: the target is built whole
(as the trainer loads it), AdamW keeps only rank 0's share of the states (the partition ZeRO-1 gives it) and
updates only those weights, and the result holds the plan beside the peak of the training steps.

--architecture dflash,dflash2 measures each drafter architecture in turn on the same batches (DFlash2 with the
config's default convolution and selector sizes), each row with its tok/s, MFU and its tok/s against the first.
--objectives measures training objectives the same way (bench_objectives.py's names: a loss and slot weights).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from flops import LayerShape, StepFlops, TargetShape, target_feature_flops, training_step_flops
from synthetic import SHAPES, causal_lm_class, target_config
from trainer.config import BLOCK_SIZE_DEFAULTS, DFLASH2_DEFAULTS, SEED_BUCKETS, TrainConfig, default_gamma
from trainer.objectives import parse_loss
from trainer.training.metrics import compiled_graphs, seconds_between, timing_mark
from trainer.training.optim import rank_share

from bench_objectives import VARIANTS as NAMED_VARIANTS  # noqa: E402  (bench/ is on sys.path)

# bench_objectives' named objectives of the DFlash architecture (--architecture picks the architecture here)
OBJECTIVES = {name: (loss, slots) for name, (loss, slots, arch) in NAMED_VARIANTS.items() if arch == "dflash"}
OBJECTIVE_NAMES = tuple(OBJECTIVES)
DEFAULT_SLOT_WEIGHTS = TrainConfig.model_fields["slot_weights"].default   # what a run gets when its config is silent

MODELS = {name: SHAPES[name] for name in ("qwen3-1.7b", "qwen3-8b", "qwen3-32b", "tiny", "qwen3.6-27b",
                                          "qwen3.6-35b-a3b", "tiny-hybrid")}
TINY_DEFAULTS = dict(buckets=[0, 64, 128, 257], token_budget=512, num_anchors=16, anchor_budget=0)
PHASES = ("data", "target", "drafter_forward", "backward", "optimizer")
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}   # dense bf16, SXM: the basis the field quotes
# before/after switches of one run: target packing, the drafter's and the target's kernels, and "legacy": the
# drafter's elementwise code as it was before (RMSNorm returning fp32 under autocast, features cast to fp32 before fc)
VARIANTS = {
    "legacy": dict(pack=False, kernels="torch", target_kernels="torch", legacy=True),
    "padded": dict(pack=False, kernels="torch", target_kernels="torch", legacy=False),
    "packed": dict(pack=True, kernels="torch", target_kernels="torch", legacy=False),
    "packed+liger-drafter": dict(pack=True, kernels="liger", target_kernels="torch", legacy=False),
    "packed+liger": dict(pack=True, kernels="liger", target_kernels="liger", legacy=False),
    "auto": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False),
    # DFlash2's block convolution as eager torch code, or compiled with dynamic shapes (the trainer's way until
    # it compiled one static graph per bucket shape, which "auto" does)
    "auto+eager-conv": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False, conv="eager"),
    "auto+dynamic-conv": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False, conv="dynamic"),
    # the loss chunks' [rows, vocab] work eager (as before) where "auto" runs it compiled (training/chunk_math.py)
    "auto+eager-loss": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False, loss="eager"),
    # the target's rotary embedding as transformers' torch code, where "auto" binds liger's (kernels.bind_rope)
    "auto+torch-rope": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False, rope=False),
    # the drafter's rotary embedding as its eager torch code, where "auto" runs it compiled (kernels.bind_drafter_rope)
    "auto+eager-drafter-rope": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False,
                                    drafter_rope=False),
    # DFlash2's selector candidates by torch.topk over the whole vocabulary, where "auto" takes them blockwise
    # (training/selector_objective.py)
    "auto+torch-topk": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False, topk="torch"),
    # the target's decoder layers torch.compile'd around its own torch modules (TargetModel.compile_layers)
    "auto+compiled-target": dict(pack="auto", kernels="auto", target_kernels="auto", legacy=False,
                                 compiled_target=True),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-8b")
    parser.add_argument("--tiny", action="store_true", help="the tiny CPU smoke shape (model, buckets, budget)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: 6 on GPU, 1 on CPU)")
    parser.add_argument("--drafter-layers", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16, help="slots per block, the same for every "
                                                                     "architecture measured (DFlash2's recipe: 8)")
    parser.add_argument("--architecture", default="dflash",
                        help="comma-separated drafter architectures measured one after the other on the same "
                             "batches: dflash, dflash2")
    parser.add_argument("--num-anchors", type=int, default=None, help="most anchors per sequence (default 512)")
    parser.add_argument("--anchor-budget", type=int, default=None,
                        help="most blocks per batch (default 3072 = 49152 slots; 0 = no cap)")
    parser.add_argument("--token-budget", type=int, default=None, help="tokens per batch (default 49152)")
    parser.add_argument("--buckets", type=int, nargs="+", default=None, help="default: the seed's buckets")
    parser.add_argument("--bucket", type=int, default=None, help="only batches of this bucket index")
    parser.add_argument("--compile", action="store_true", help="torch.compile the drafter; pad to bucket bounds")
    parser.add_argument("--profile", default=None, help="write a torch.profiler trace of 2 steps to this file")
    parser.add_argument("--skip-baselines", action="store_true",
                        help="time the training step only (no plain-forward or target-alone baselines)")
    parser.add_argument("--plain-length", type=int, default=4096,
                        help="sequence length of the plain-forward baseline (rows fill the token budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate-shards", type=int, default=0, metavar="N",
                        help="hold what rank 0 of N ranks holds with the optimizer sharded N ways, and report the "
                             "memory plan beside the measured peak (a memory check: other weights stay fixed)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated step variants measured one after the other in this process, on the "
                             "same batches (before/after figures of one run): " + ", ".join(VARIANTS)
                             + "; default: the trainer's own choice (pack_target and kernels auto)")
    parser.add_argument("--loss", default="ce",
                        help="training objective, as the config's loss: (a name, or JSON like '{\"ce\": 0.1, "
                             "\"cap\": 0.9}'); kl/tv/nla/lk_hybrid build the whole target and count its last layers "
                             "and LM head (default ce)")
    parser.add_argument("--slot-weights", choices=("decay", "dpace"), default=DEFAULT_SLOT_WEIGHTS,
                        help=f"the config's slot_weights (default: the trainer's, {DEFAULT_SLOT_WEIGHTS})")
    parser.add_argument("--objectives", default=None,
                        help="comma-separated objectives measured one after the other on the same batches, by "
                             "bench_objectives.py's names (" + ", ".join(OBJECTIVE_NAMES) + "); instead of "
                             "--loss/--slot-weights")
    parser.add_argument("--warm-pass", action=argparse.BooleanOptionalAction, default=None,
                        help="measure the first architecture and objective once, untimed and discarded, before the "
                             "measured rows, so the first row is not charged the cold caches and allocator growth the "
                             "later rows do not pay (default: on when several rows are measured)")
    parser.add_argument("--target-precision", default=None,
                        help="instead of the training step: the target's feature pass (the step's target phase) "
                             "timed in each of these precisions on the same batches, e.g. bf16,fp8 (the config's "
                             "target_precision), and the tapped states' relative error against the first; one "
                             "JSON object")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.target_precision is not None:
        from target_precision import parse_precisions

        try:
            args.target_precisions = parse_precisions(args.target_precision)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        args.loss_weights = parse_loss(json.loads(args.loss) if args.loss.lstrip().startswith("{") else args.loss)
    except ValueError as exc:
        parser.error(f"--loss: {exc}")
    if args.objectives is None:
        args.objective_list = [(args.loss if args.slot_weights == "decay" else f"{args.loss}+{args.slot_weights}",
                                args.loss_weights, args.slot_weights)]
    else:
        names = [name for name in args.objectives.split(",") if name]
        wrong = [name for name in names if name not in OBJECTIVE_NAMES]
        if wrong or not names:
            parser.error(f"unknown objective(s) {', '.join(wrong) or '(none)'}; known: {', '.join(OBJECTIVE_NAMES)}")
        args.objective_list = [(name, parse_loss(OBJECTIVES[name][0]), OBJECTIVES[name][1]) for name in names]
    unknown = [v for v in (args.variants or "").split(",") if v and v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.architectures = [a for a in args.architecture.split(",") if a]
    wrong = [a for a in args.architectures if a not in BLOCK_SIZE_DEFAULTS]
    if wrong or not args.architectures:
        parser.error(f"unknown architecture(s) {', '.join(wrong) or '(none)'}; known: dflash, dflash2")
    defaults = TINY_DEFAULTS if args.tiny else dict(buckets=list(SEED_BUCKETS), token_budget=49152,
                                                    num_anchors=512, anchor_budget=3072)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tiny:
        args.model = "tiny"
    return args


# ---------------------------------------------------------------------------------------------- devices

def setup_device(requested: str) -> SimpleNamespace:
    """This process's device; under torchrun, one process group over the ranks (NCCL on GPUs, gloo on CPUs)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world)
    return SimpleNamespace(device=device, rank=rank, world_size=world, is_main=rank == 0)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(device: torch.device) -> tuple[float, str]:
    """Best of five timings of a square matrix product, after at least a second of the same products on a GPU (its
    clocks settle; three short timings from a cold start differed 4.4 % between two processes on one H100): bf16
    8192^3 on a GPU, 200 products a timing; fp32 512^3 on a CPU, 10."""
    on_gpu = device.type == "cuda"
    size, dtype, iters, warm_s = (8192, torch.bfloat16, 200, 1.0) if on_gpu else (512, torch.float32, 10, 0.0)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    began = time.perf_counter()
    while True:
        for _ in range(10):
            a @ b
        synchronize(device)
        if time.perf_counter() - began >= warm_s:
            break
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / iters)
    return 2 * size ** 3 / best / 1e12, f"{str(dtype).removeprefix('torch.')} {size}^3"


class PhaseClock:
    """Marks between the phases of each step: CUDA events on a GPU (read once at the end, so no step waits
    for the GPU), perf_counter elsewhere (CPU kernels finish before they return)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[list] = []

    def mark(self):
        return timing_mark(self.cuda)

    def seconds(self) -> dict[str, float]:
        totals = dict.fromkeys(PHASES, 0.0)
        if self.cuda and self.steps:
            self.steps[-1][-1].synchronize()
        for marks in self.steps:
            for name, start, end in zip(PHASES, marks, marks[1:]):
                totals[name] += seconds_between(start, end)
        return totals


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30, "cuda max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, "process peak RSS"


# ---------------------------------------------------------------------------------------------- models and data

def build_target(shape: dict, *, num_taps: int, device: torch.device, dtype: torch.dtype, whole: bool = False):
    """A random target with only the layers up to its last tap (the feature pass never runs the rest), or
    `whole`, with all of them, as the trainer loads it."""
    from trainer.model.target import TargetModel
    from trainer.planning.taps import default_target_layer_ids

    taps = default_target_layer_ids(shape["num_hidden_layers"], num_taps)
    config = target_config(shape, num_layers=None if whole else taps[-1] + 1)
    with torch.device(device):
        model = causal_lm_class(config)._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return TargetModel(model, layer_ids=taps, mask_token_id=shape["vocab_size"] - 1), taps


def build_drafter(target, args, device: torch.device, architecture: str = "dflash"):
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.planning.dflash2 import Dflash2Sizes

    config = DrafterConfig.from_target(target.config, num_layers=args.drafter_layers, block_size=args.block_size,
                                       target_layer_ids=target.layer_ids, mask_token_id=target.mask_token_id,
                                       dflash2=Dflash2Sizes(**DFLASH2_DEFAULTS) if architecture == "dflash2" else None)
    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    return drafter.to(device=device, dtype=torch.float32).train()


def synthetic_dataset(args, *, vocab_size: int, batches_needed: int):
    """Chats in the chosen buckets, enough for `batches_needed` batches: an unsupervised prompt of 5-30 % of
    the sample, then a supervised answer."""
    import pyarrow as pa

    from trainer.data.batches import TokenDataset

    rng = np.random.default_rng(args.seed)
    buckets = [args.bucket] if args.bucket is not None else range(len(args.buckets) - 1)
    per_bucket = -(-batches_needed // len(buckets)) + 1
    ids, masks = [], []
    for b in buckets:
        lo, hi = args.buckets[b], args.buckets[b + 1]
        batch_size = max(1, args.token_budget // (hi - 1))
        for length in rng.integers(max(lo, 2 * args.block_size + 2), hi, size=per_bucket * batch_size):
            prompt = int(length * rng.uniform(0.05, 0.3))
            ids.append(rng.integers(0, vocab_size - 1, size=length, dtype=np.int32))
            masks.append(np.concatenate([np.zeros(prompt, np.int8), np.ones(length - prompt, np.int8)]))
    table = pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int32())),
                      "loss_mask": pa.array(masks, type=pa.list_(pa.int8()))})
    return TokenDataset(path="synthetic", table=table, lengths=np.array([len(x) for x in ids], dtype=np.int64))


def batch_stream(dataset, args, ctx):
    from trainer.data.batches import BatchStream, layout_buckets

    layout = layout_buckets(dataset.lengths, bounds=args.buckets, token_budget=args.token_budget,
                            max_length=args.buckets[-1] - 1, overlong="truncate")
    return BatchStream(dataset, layout, seed=args.seed, rank=ctx.rank, world_size=ctx.world_size,
                       max_length=args.buckets[-1] - 1, pad_to_bucket=args.compile, pad_token_id=0,
                       num_workers=2, prefetch=4, pin_memory=ctx.device.type == "cuda")


def to_device(batch, device: torch.device):
    """(input_ids, loss_mask) on the device, and the attention mask left on the CPU as the trainer leaves it
    (features() reads the right padding there)."""
    ids, loss_mask = (t.to(device, non_blocking=True) for t in (batch.input_ids, batch.loss_mask))
    return ids, loss_mask, batch.attention_mask


def all_ranks_sum(value: float, ctx) -> float:
    import torch.distributed as dist

    if ctx.world_size == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(total)
    return float(total)


# ---------------------------------------------------------------------------------------------- measurements

def measure_target_only(target, stream, args, ctx, autocast, *, forward=None) -> dict:
    """Feature throughput of the target alone: the batches are on the device before the clock starts, and each
    has run once before it is timed (Triton kernels, fla's among them, compile and autotune per shape on first
    sight: a steady-state figure, as over a long run). `forward(input_ids, cpu_mask)` replaces the feature pass
    (the plain packed forward below)."""
    shape = TargetShape.from_config(target.config)
    forward = forward or target.features
    batches = [next(stream) for _ in range(args.steps)]
    on_device = [to_device(batch, ctx.device) for batch in batches]
    for input_ids, _, attention_mask in on_device:
        with autocast:
            forward(input_ids, attention_mask)
    synchronize(ctx.device)
    start = time.perf_counter()
    for input_ids, _, attention_mask in on_device:
        with autocast:
            forward(input_ids, attention_mask)
    synchronize(ctx.device)
    seconds = time.perf_counter() - start
    lengths = [batch.attention_mask.sum(dim=1).tolist() for batch in batches]
    tokens = sum(sum(row) for row in lengths)
    flops = sum(target_feature_flops(shape, num_layers=target.layer_ids[-1] + 1, lengths=row) for row in lengths)
    return {"seconds": seconds, "tokens": tokens, "flops": flops,
            "tok_per_s": all_ranks_sum(tokens, ctx) / seconds}


@contextlib.contextmanager
def tapped_layers_only(target):
    """The decoder cut to the layers the feature pass runs (up to the last tap), so that a baseline does the same
    work as the pass it is held against, also where the whole target was built (--simulate-shards)."""
    layers = target.decoder.layers
    target.decoder.layers = layers[:target.layer_ids[-1] + 1]
    try:
        yield
    finally:
        target.decoder.layers = layers


def plain_packed_forward(target):
    """The HF decoder's own forward (no taps, no unpacking) over a batch's real tokens packed into one row, with
    the same per-sequence attention the packed feature pass uses: the baseline of "the same packed tokens"."""
    from trainer.model import packing
    from trainer.model.target import linear_attention_kernel
    from trainer.planning.target_families import LINEAR

    @torch.no_grad()
    def forward(input_ids, attention_mask):
        plan = packing.plan(attention_mask, target.device)
        linear = contextlib.nullcontext()
        if LINEAR in target.spec.layer_types:
            linear = packing.packed_linear_attention(target.spec.model_type, plan,
                                                     kernel=linear_attention_kernel(target.spec))
        with packing.packed_attention(target.config), linear, tapped_layers_only(target):
            target.decoder(input_ids=packing.pack(input_ids, plan), position_ids=plan.position_ids, use_cache=False,
                           **packing.attention_kwargs(plan))
    return forward


def measure_plain_forward(target, args, ctx, autocast) -> dict:
    """The baseline the feature pass is held to: the HF decoder's own forward over the same layers (up to the last
    tap) at one fixed shape (rows x length = the token budget, no padding, no taps), timed like the other
    measurements."""
    length = min(args.plain_length, args.buckets[-1] - 1)
    rows = max(1, args.token_budget // length)
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, target.config.vocab_size - 1, (rows, length), generator=generator).to(ctx.device)
    with torch.no_grad(), autocast, tapped_layers_only(target):
        for _ in range(max(1, args.warmup // 2)):
            target.decoder(input_ids=ids, use_cache=False)
        synchronize(ctx.device)
        start = time.perf_counter()
        for _ in range(args.steps):
            target.decoder(input_ids=ids, use_cache=False)
        synchronize(ctx.device)
    seconds = time.perf_counter() - start
    layers = target.layer_ids[-1] + 1
    flops = args.steps * target_feature_flops(TargetShape.from_config(target.config), num_layers=layers,
                                              lengths=[length] * rows)
    return {"seconds": seconds, "flops": flops, "rows": rows, "length": length,
            "tok_per_s": all_ranks_sum(args.steps * rows * length, ctx) / seconds}


def anchors_per_sequence(args, batch_size: int) -> int:
    if not args.anchor_budget:
        return args.num_anchors
    return max(1, min(args.num_anchors, args.anchor_budget // batch_size))


def train_step(parts: SimpleNamespace, stream, args, ctx, autocast, clock: PhaseClock | None):
    """One step as the trainer runs it, with a clock mark between phases: (output, batch)."""
    from trainer.training.objective import dflash_step

    marks = [clock.mark()] if clock else []
    batch = next(stream)
    input_ids, loss_mask, attention_mask = to_device(batch, ctx.device)
    marks += [clock.mark()] if clock else []
    final = parts.objective.needs_target_distribution
    with autocast:
        features = parts.target.features(input_ids, attention_mask, final=final)
    features, target_hidden = features if final else (features, None)
    marks += [clock.mark()] if clock else []
    with autocast:
        out = dflash_step(parts.model, features, input_ids, loss_mask,
                          num_anchors=anchors_per_sequence(args, len(input_ids)), block_size=args.block_size,
                          gamma=default_gamma(args.block_size), noise=0.0, generator=parts.anchor_rng,
                          objective=parts.objective, target_hidden=target_hidden)
    marks += [clock.mark()] if clock else []
    out.loss.backward()
    marks += [clock.mark()] if clock else []
    torch.nn.utils.clip_grad_norm_(parts.params, 1.0)
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    if clock:
        clock.steps.append(marks + [clock.mark()])
    return out, batch


def replay_flops(records: list, parts: SimpleNamespace, args) -> tuple[StepFlops, int, int]:
    """The model FLOPs of the timed steps, counted afterwards from the anchors each step drew (the sampler is
    replayed on the CPU from the generator state saved before the step): (flops, real blocks, padded blocks)."""
    from trainer.training.objective import sample_anchors

    target_shape = TargetShape.from_config(parts.target.config)
    drafter_shape = LayerShape.from_config(parts.drafter.config)
    total, real, padded = StepFlops(0, 0, 0, 0, 0), 0, 0
    whole = parts.target.num_layers if parts.objective.needs_target_distribution else None
    generator = torch.Generator()
    for rng_state, loss_mask, lengths in records:
        generator.set_state(rng_state)
        anchors = sample_anchors(loss_mask, anchors_per_sequence(args, len(loss_mask)), generator)
        total = total + training_step_flops(
            target_shape, drafter_shape, target_layers=parts.target.layer_ids[-1] + 1,
            drafter_layers=args.drafter_layers, num_taps=len(parts.target.layer_ids), block_size=args.block_size,
            lengths=lengths, anchors=anchors.tolist(), dflash2=parts.drafter.config.dflash2,
            total_layers=whole)
        real += int((anchors >= 0).sum())
        padded += int((anchors < 0).sum())
    return total, real, padded


def warm_target_shapes(target, stream, args, ctx, autocast) -> None:
    """The target's feature pass, untimed, over the batches the training measurement is about to time (`stream`: a
    fresh stream of the same seed): Triton kernels (fla's, liger's) compile and autotune per shape on first sight,
    and the warm-up steps alone do not meet every shape the timed ones do. A long run pays that once."""
    for _ in range(args.warmup + args.steps):
        input_ids, _, attention_mask = to_device(next(stream), ctx.device)
        with autocast:
            target.features(input_ids, attention_mask)
    synchronize(ctx.device)


def measure_training(parts: SimpleNamespace, stream, args, ctx, autocast) -> dict:
    for _ in range(args.warmup):
        train_step(parts, stream, args, ctx, autocast, None)
    synchronize(ctx.device)
    frames_before = compiled_graphs()
    clock, records, losses = PhaseClock(ctx.device), [], []
    start = time.perf_counter()
    for _ in range(args.steps):
        state = parts.anchor_rng.get_state()
        out, batch = train_step(parts, stream, args, ctx, autocast, clock)
        losses.append(out.loss.detach())
        records.append((state, batch.loss_mask.clone(), batch.attention_mask.sum(dim=1).tolist()))
    synchronize(ctx.device)
    seconds = time.perf_counter() - start
    phases = clock.seconds()
    flops, real, padded = replay_flops(records, parts, args)
    tokens = sum(sum(lengths) for _, _, lengths in records)
    positions = sum(mask.numel() for _, mask, _ in records)
    return {"seconds": seconds, "tokens": tokens, "flops": flops, "phases": phases, "real_blocks": real,
            "padding_share": 1 - tokens / positions,
            "padded_blocks": padded, "frames_after_warmup": compiled_graphs() - frames_before,
            "loss": float(torch.stack(losses).float().mean()), "tok_per_s": all_ranks_sum(tokens, ctx) / seconds}


def warm_pass(parts: SimpleNamespace, dataset, args, ctx, autocast, objective, name: str) -> None:
    """The first row's whole measurement, run once and thrown away: the row measured first otherwise pays what every
    later row finds ready (allocator segments, cuBLAS and Triton autotune caches, lazily built kernels)."""
    parts.objective = objective
    stream, warming = batch_stream(dataset, args, ctx), batch_stream(dataset, args, ctx)
    try:
        with variant(name, parts, args, ctx):
            warm_target_shapes(parts.target, warming, args, ctx, autocast)
            measure_training(parts, stream, args, ctx, autocast)
    finally:
        stream.close()
        warming.close()


@contextlib.contextmanager
def legacy_elementwise():
    """The drafter's RMSNorm and context projection as they were before the dtype fix: an fp32 master weight made
    the normalised output (and so the residual stream) fp32, and the bf16 features were cast to fp32 before fc."""
    from trainer.model.drafter import DFlashDrafter, RMSNorm

    def norm(self, x):
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)

    def project(self, features):
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    saved = RMSNorm.forward, DFlashDrafter.project_context
    RMSNorm.forward, DFlashDrafter.project_context = norm, project
    try:
        yield
    finally:
        RMSNorm.forward, DFlashDrafter.project_context = saved


def conv_shapes(args) -> list[tuple[int, int]]:
    """The block convolutions' input shapes the trainer compiles for these buckets (one per bucket)."""
    from trainer.training.compile_warmup import conv_shapes as trainer_conv_shapes

    sizes = [max(1, args.token_budget // max(1, hi - 1)) for hi in args.buckets[1:]]
    return trainer_conv_shapes(sizes, lambda size: anchors_per_sequence(args, size), args.block_size)


def bind_block_convs(parts: SimpleNamespace, args, ctx, way: str) -> None:
    """DFlash2's block convolutions as the variant says: "per-shape" (the trainer's: one static graph per bucket
    shape, compiled here before the clock starts, as the trainer's start-up does), "dynamic" or "eager"."""
    from trainer.model import kernels
    from trainer.training.compile_warmup import compile_block_conv_shapes

    shapes = conv_shapes(args) if way == "per-shape" else None
    if kernels.compile_block_convs(parts.drafter, ctx.device, on=way != "eager", shapes=shapes) and shapes:
        compile_block_conv_shapes(parts.drafter, shapes, feature_dtype=torch.bfloat16,
                                  autocast=torch.autocast("cuda", dtype=torch.bfloat16), say=lambda line: None)


@contextlib.contextmanager
def variant(name: str, parts: SimpleNamespace, args, ctx):
    """The target's packing and the drafter's kernels (and the legacy code) of one variant, restored after."""
    from trainer.model import kernels
    from trainer.training import chunk_math, selector_objective

    spec = VARIANTS[name]
    parts.target.packing = spec["pack"]
    chunk_math.DEFAULT.compiled = spec.get("loss") != "eager"
    selector_objective.BLOCKWISE = spec.get("topk") != "torch"
    kernels.install_drafter(parts.drafter, kernels.resolve(spec["kernels"], ctx.device))
    if spec.get("drafter_rope") is False:
        kernels.bind_drafter_rope(False)
    kernels.install_target(parts.target.hf_model, kernels.resolve(spec["target_kernels"], ctx.device))
    if spec.get("rope") is False:
        kernels.bind_rope(parts.target.hf_model, False)
    bind_block_convs(parts, args, ctx, spec.get("conv", "per-shape"))
    parts.target.compile_layers(spec.get("compiled_target", False))
    try:
        with legacy_elementwise() if spec["legacy"] else contextlib.nullcontext():
            yield
    finally:
        parts.target.packing = "auto"
        parts.target.compile_layers(False)
        chunk_math.DEFAULT.compiled = True
        selector_objective.BLOCKWISE = True
        kernels.install_drafter(parts.drafter, "torch")
        kernels.install_target(parts.target.hf_model, "torch")
        kernels.compile_block_convs(parts.drafter, ctx.device, on=False)


def profile_steps(parts: SimpleNamespace, stream, args, ctx, autocast) -> str:
    """Two steps under torch.profiler: a Chrome trace at --profile and the top operators as a table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(2):
            train_step(parts, stream, args, ctx, autocast, None)
        synchronize(ctx.device)
    if ctx.is_main:
        prof.export_chrome_trace(args.profile)
    # self time: an operator's total also counts its launches' stalls behind a busy GPU ("Command Buffer Full")
    sort_by = "self_cuda_time_total" if ctx.device.type == "cuda" else "self_cpu_time_total"
    table = "two training steps\n" + prof.key_averages().table(sort_by=sort_by, row_limit=40)
    with profile(activities=activities) as target_prof:   # the target phase alone: 62 % of an 8B step
        for _ in range(2):
            input_ids, _, attention_mask = to_device(next(stream), ctx.device)
            with autocast:
                parts.target.features(input_ids, attention_mask, final=parts.objective.needs_target_distribution)
        synchronize(ctx.device)
    table += "\n\nthe target's feature pass of two batches\n" + target_prof.key_averages().table(
        sort_by=sort_by, row_limit=30)
    return table + ("\n" + host_waits(parts, stream, args, ctx, autocast) if ctx.device.type == "cuda" else "")


def host_waits(parts: SimpleNamespace, stream, args, ctx, autocast) -> str:
    """One more step with CUDA's sync debug mode on: each place that made the host wait for the device, by count.
    A wait inside a loop of small kernels leaves the GPU idle while the loop's Python runs."""
    import collections
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(parts, stream, args, ctx, autocast, None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        synchronize(ctx.device)
    places = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                 if "synchronizing" in str(w.message))
    lines = [f"host waits in one step: {sum(places.values())}"]
    lines += [f"  {count:5d}  {place}" for place, count in places.most_common(20)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- report

def summarise(args, ctx, *, peak: tuple[float, str], taps: list[int], target_only: dict | None, training: dict,
              plain: dict | None, target_line: str, plain_packed: dict | None = None) -> dict:
    """The figures; the baselines' (and the ratios to them) are None when they were skipped."""
    flops, phases = training["flops"], training["phases"]
    world_peak = peak[0] * 1e12 * ctx.world_size
    datasheet = datasheet_tflops(ctx.device)
    phase_total = sum(phases.values()) or 1.0
    target_rate = training["tokens"] / phases["target"] if phases["target"] else 0.0

    def ratio(baseline: dict | None, rate: float) -> float | None:
        return target_rate / rate if baseline and rate else None

    def rates(measured: dict | None, **extra) -> dict | None:
        if measured is None:
            return None
        mfu = all_ranks_sum(measured["flops"], ctx) / measured["seconds"] / world_peak
        return {"tok_per_s": measured["tok_per_s"], "mfu": mfu, **extra}
    blocks = training["real_blocks"] + training["padded_blocks"]
    return {
        "device": str(ctx.device), "device_name": device_name(ctx.device), "world_size": ctx.world_size,
        "model": args.model, "shape": MODELS[args.model], "taps": taps, "compile": args.compile,
        "steps": args.steps, "warmup": args.warmup, "buckets": args.buckets, "bucket": args.bucket,
        "token_budget": args.token_budget, "num_anchors": args.num_anchors, "anchor_budget": args.anchor_budget,
        "block_size": args.block_size, "drafter_layers": args.drafter_layers,
        "matmul_peak_tflops": peak[0], "matmul_peak_what": peak[1],
        "target_line": target_line,
        "plain_forward": rates(plain, **({"rows": plain["rows"], "length": plain["length"]} if plain else {})),
        "target_only": rates(target_only),
        "plain_forward_packed": rates(plain_packed),
        "step": {
            "tok_per_s": training["tok_per_s"], "step_ms": 1000 * training["seconds"] / args.steps,
            "mfu": all_ranks_sum(flops.total, ctx) / training["seconds"] / world_peak,
            "mfu_datasheet": (all_ranks_sum(flops.total, ctx) / training["seconds"] / (datasheet * 1e12 * ctx.world_size)
                              if datasheet else None),
            "target_tflops": flops.target / phases["target"] / 1e12 if phases["target"] else None,
            "drafter_tflops": (flops.drafter_total / (phases["drafter_forward"] + phases["backward"]) / 1e12
                               if phases["drafter_forward"] + phases["backward"] else None),
            "flops_per_step": {k: v / args.steps for k, v in flops.as_dict().items()},
            "target_flop_share": flops.target / flops.total, "drafter_flop_share": flops.drafter_total / flops.total,
            "distribution_flop_share": flops.target_distribution / flops.total,
            "phase_share": {k: v / phase_total for k, v in phases.items()},
            "target_phase_tok_per_s": target_rate,
            "target_in_step_ratio": ratio(target_only, target_only and target_only["tokens"] / target_only["seconds"]),
            "target_phase_vs_plain_forward": ratio(plain, plain and plain["tok_per_s"] / ctx.world_size),
            "target_phase_vs_plain_packed": ratio(plain_packed, plain_packed and plain_packed["tokens"]
                                                  / plain_packed["seconds"]),
            "padded_block_share": training["padded_blocks"] / blocks if blocks else 0.0,
            # of the right-padded batches: what a target pass without packing computes for nothing
            "target_padding_share": training["padding_share"],
            "loss": training["loss"],
        },
        "peak_memory_gib": peak_memory_gib(ctx.device)[0], "peak_memory_kind": peak_memory_gib(ctx.device)[1],
        "compiled_frames_after_warmup": training["frames_after_warmup"],
        "compiled_frames_total": compiled_graphs(),
    }


def variant_row(name: str, summary: dict, peak_gib: float, architecture: str = "dflash",
                objective: str = "ce") -> dict:
    step = summary["step"]
    return {"variant": name, "architecture": architecture, "objective": objective, "tok_per_s": step["tok_per_s"],
            "step_ms": step["step_ms"], "mfu": step["mfu"],
            "mfu_datasheet": step["mfu_datasheet"], "target_tflops": step["target_tflops"],
            "drafter_tflops": step["drafter_tflops"], "phase_share": step["phase_share"],
            "target_phase_vs_plain_forward": step["target_phase_vs_plain_forward"],
            "target_phase_vs_plain_packed": step["target_phase_vs_plain_packed"], "peak_memory_gib": peak_gib}


def datasheet_tflops(device: torch.device) -> float | None:
    name = device_name(device)
    return next((tflops for key, tflops in DATASHEET_BF16_TFLOPS.items() if key in name), None)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


def planned_memory(args, target, drafter, objective, ctx, variant_name: str) -> dict:
    """The trainer's memory plan of rank 0 of --simulate-shards ranks for this very target and drafter at this
    budget, with the drafter's kernels of the last variant measured, and the peak that variant measured against
    it (the plan's reserve stands for what the allocator's counters do not see: the CUDA context, NCCL,
    fragmentation)."""
    from trainer.model import kernels
    from trainer.planning import memory_plan

    cfg = TrainConfig(target_path="(synthetic)", data_path="-", output_dir="-", token_budget=args.token_budget,
                      buckets=args.buckets, num_anchors=args.num_anchors, anchor_budget=args.anchor_budget,
                      block_size=args.block_size, drafter_layers=args.drafter_layers,
                      target_layer_ids=target.layer_ids, simulate_shards=args.simulate_shards,
                      loss=objective.weights, slot_weights=objective.slot_weights)
    on_gpu = ctx.device.type == "cuda"
    limit = torch.cuda.get_device_properties(ctx.device).total_memory if on_gpu else None
    plan = memory_plan.config_plan(cfg, world_size=1, limit=limit, on_gpu=on_gpu, text=target.config.to_dict(),
                                   drafter=memory_plan.DrafterSizes.from_drafter_config(drafter.config.to_hf_dict()),
                                   kernels=kernels.resolve(VARIANTS[variant_name]["kernels"], ctx.device))
    measured = {"peak_allocated_gib": peak_memory_gib(ctx.device)[0]}
    if on_gpu:
        measured["peak_reserved_gib"] = torch.cuda.max_memory_reserved(ctx.device) / 2 ** 30
    planned = (plan.total - plan.reserve) / 2 ** 30
    lines = plan.lines() + [f"  measured    peak allocated {measured['peak_allocated_gib']:.1f} GiB against "
                            f"{planned:.1f} GiB planned without the reserve"
                            + (f", reserved {measured['peak_reserved_gib']:.1f} GiB" if on_gpu else "")]
    return {"total_gib": plan.total / 2 ** 30, "without_reserve_gib": planned, "fits": plan.fits,
            "activations_gib": {k: v / 2 ** 30 for k, v in plan.activations.items()}, **measured, "lines": lines}


def format_table(result: dict) -> str:
    step, target, plain = result["step"], result["target_only"], result["plain_forward"]
    baselines = [
        f"plain HF forward ({plain['rows']} x {plain['length']}): {plain['tok_per_s']:,.0f} tok/s, "
        f"MFU {plain['mfu']:.1%}" if plain else "plain HF forward: not measured",
        f"target features alone: {target['tok_per_s']:,.0f} tok/s, MFU {target['mfu']:.1%}" if target
        else "target features alone: not measured",
    ]
    inside = f"  target inside the step: {step['target_phase_tok_per_s']:,.0f} tok/s"
    if step["target_in_step_ratio"] is not None:
        inside += f" = {step['target_in_step_ratio']:.1%} of the target alone"
    if step["target_phase_vs_plain_forward"] is not None:
        inside += f", {step['target_phase_vs_plain_forward']:.1%} of the plain forward"
    if step["target_phase_vs_plain_packed"] is not None:
        inside += f", {step['target_phase_vs_plain_packed']:.1%} of the plain forward of the same packed tokens"
    lines = [
        f"{result['model']} on {result['world_size']} x {result['device_name']} ({result['device']}), "
        f"compile={result['compile']}, taps {result['taps']}, loss {result.get('objective', 'ce')}",
        result["target_line"],
        f"matmul peak ({result['matmul_peak_what']}): {result['matmul_peak_tflops']:.3g} TFLOP/s",
        *baselines,
        f"training step:        {step['tok_per_s']:,.0f} tok/s, {step['step_ms']:.1f} ms/step, MFU {step['mfu']:.1%}",
        "  MFU against the datasheet's bf16 peak: " + (f"{step['mfu_datasheet']:.1%}" if step["mfu_datasheet"]
                                                        else "no datasheet figure for this device"),
        f"  phases: target {step['target_tflops'] or 0:.0f} TFLOP/s, drafter fwd+bwd {step['drafter_tflops'] or 0:.0f}"
        f" TFLOP/s; padding in the batches {step['target_padding_share']:.1%}",
        *(f"  variant {row['variant']:>13}: {row['tok_per_s']:,.0f} tok/s, {row['step_ms']:.1f} ms/step, MFU "
          f"{row['mfu']:.1%}, peak {row['peak_memory_gib']:.1f} GiB"
          + (f", {row['tok_per_s_vs_first']:.1%} of the first's tok/s" if "tok_per_s_vs_first" in row else "")
          for row in result.get("variants", [])),
        f"  FLOP shares: target {step['target_flop_share']:.1%}, drafter {step['drafter_flop_share']:.1%}, the "
        f"target's distribution for the loss {step['distribution_flop_share']:.1%} "
        f"(padded blocks {step['padded_block_share']:.1%}, not counted)",
        "  time shares: " + ", ".join(f"{k} {v:.1%}" for k, v in step["phase_share"].items()),
        inside,
        f"peak memory: {result['peak_memory_gib']:.2f} GiB ({result['peak_memory_kind']}); compiled frames after "
        f"warm-up: {result['compiled_frames_after_warmup']} (total {result['compiled_frames_total']})",
    ]
    return "\n".join(lines)


def build_parts(target, args, ctx, architecture: str, objective) -> SimpleNamespace:
    """The drafter of one architecture, wrapped as the trainer wraps it, with its optimizer and anchor sampler."""
    on_gpu = ctx.device.type == "cuda"
    drafter = build_drafter(target, args, ctx.device, architecture)
    model = drafter
    if ctx.world_size > 1:
        from trainer.train import DraftDDP

        model = DraftDDP(drafter, device_ids=[ctx.device] if on_gpu else None)
    if args.compile:
        model = torch.compile(model)
    params = [p for p in drafter.parameters() if p.requires_grad]
    trained = rank_share(params, args.simulate_shards, rank=0) if args.simulate_shards else params
    return SimpleNamespace(
        target=target, drafter=drafter, model=model, params=params, architecture=architecture, objective=objective,
        optimizer=torch.optim.AdamW(trained, lr=6e-4, weight_decay=0.0, betas=(0.9, 0.95), fused=on_gpu),
        anchor_rng=torch.Generator().manual_seed(args.seed * 1009 + ctx.rank))


def compare_target_precisions(target, args, ctx, dtype, progress) -> int:
    """--target-precision: the target phase in each precision (bench/target_precision.py), one JSON object."""
    import target_precision

    from trainer.model import kernels

    kernels.install_target(target.hf_model, kernels.resolve("auto", ctx.device))
    dataset = synthetic_dataset(args, vocab_size=target.config.vocab_size, batches_needed=args.steps + 2)
    autocast = torch.autocast(device_type=ctx.device.type, dtype=dtype, enabled=ctx.device.type == "cuda")
    stream = batch_stream(dataset, args, ctx)
    try:
        rows = target_precision.compare(target, stream, args, ctx.device, autocast, args.target_precisions,
                                        progress)
    finally:
        stream.close()
    print(json.dumps({"device_name": device_name(ctx.device), "model": args.model, "taps": target.layer_ids,
                      "target_precision": rows}), flush=True)
    return 0


def main(argv=None) -> int:
    import sys

    args = parse_args(argv)
    ctx = setup_device(args.device)
    on_gpu = ctx.device.type == "cuda"
    n_buckets = 1 if args.bucket is not None else len(args.buckets) - 1
    if args.warmup is None:
        args.warmup = 2 * n_buckets if on_gpu else 1
    dtype = torch.bfloat16 if on_gpu else torch.float32
    torch.manual_seed(args.seed)
    peak = matmul_peak_tflops(ctx.device)
    began = time.perf_counter()

    def progress(what: str) -> None:  # on stderr: a run cut short still shows where its time went
        if ctx.is_main:
            print(f"[{time.perf_counter() - began:.0f}s] {what}", file=sys.stderr, flush=True)

    from trainer.training.losses import Objective

    objectives = [(label, Objective(weights, slots)) for label, weights, slots in args.objective_list]
    whole = args.simulate_shards > 0 or any(objective.needs_target_distribution for _, objective in objectives)
    target, taps = build_target(MODELS[args.model], num_taps=args.drafter_layers, device=ctx.device, dtype=dtype,
                                whole=whole)
    progress(target.describe())
    if args.target_precision is not None:
        return compare_target_precisions(target, args, ctx, dtype, progress)
    parts = build_parts(target, args, ctx, args.architectures[0], objectives[0][1])
    dataset = synthetic_dataset(args, vocab_size=target.config.vocab_size,
                                batches_needed=(args.warmup + args.steps + 2) * ctx.world_size)
    autocast = torch.autocast(device_type=ctx.device.type, dtype=dtype, enabled=on_gpu)
    streams = [batch_stream(dataset, args, ctx) for _ in range(2)]   # the same batches for both measurements
    try:
        plain = target_only = plain_packed = None
        if not args.skip_baselines:
            plain = measure_plain_forward(target, args, ctx, autocast)
            progress(f"plain forward: {plain['tok_per_s']:,.0f} tok/s")
            target_only = measure_target_only(target, streams[0], args, ctx, autocast)
            progress(f"target features alone: {target_only['tok_per_s']:,.0f} tok/s")
            stream = batch_stream(dataset, args, ctx)   # the batches of the target-alone measurement
            try:
                plain_packed = measure_target_only(target, stream, args, ctx, autocast,
                                                   forward=plain_packed_forward(target))
            finally:
                stream.close()
            progress(f"plain forward of the same packed tokens: {plain_packed['tok_per_s']:,.0f} tok/s")
        names = args.variants.split(",") if args.variants else ["auto"]
        rows = len(args.architectures) * len(objectives) * len(names)
        if args.warm_pass if args.warm_pass is not None else rows > 1:
            warm_pass(parts, dataset, args, ctx, autocast, objectives[0][1], names[0])
            progress("warm pass done (untimed, discarded)")
        measured = []
        for architecture in args.architectures:
            if architecture != parts.architecture:   # the previous drafter and its optimizer go first
                del parts
                if on_gpu:
                    torch.cuda.empty_cache()
                parts = build_parts(target, args, ctx, architecture, objectives[0][1])
            for objective_label, objective in objectives:
                parts.objective = objective   # the same drafter and optimizer: only the loss differs
                for name in names:
                    if on_gpu:  # each variant's own peak (and the plan's, with --simulate-shards, of training steps)
                        torch.cuda.reset_peak_memory_stats(ctx.device)
                    stream = batch_stream(dataset, args, ctx)   # a fresh stream of the same seed: the same batches
                    warming = batch_stream(dataset, args, ctx)
                    try:
                        with variant(name, parts, args, ctx):
                            warm_target_shapes(parts.target, warming, args, ctx, autocast)
                            training = measure_training(parts, stream, args, ctx, autocast)
                            peak_gib = peak_memory_gib(ctx.device)[0]
                            last = (name, architecture, objective) == (names[-1], args.architectures[-1],
                                                                       objectives[-1][1])
                            table = profile_steps(parts, stream, args, ctx, autocast) if args.profile and last \
                                else None
                    finally:
                        stream.close()
                        warming.close()
                    label = "/".join(part for part, several in ((architecture, len(args.architectures) > 1),
                                                                (objective_label, len(objectives) > 1),
                                                                (name, True)) if several)
                    measured.append((label, training, peak_gib, architecture, objective.describe()))
                    progress(f"training ({label}): {training['tok_per_s']:,.0f} tok/s")
    finally:
        for stream in streams:
            stream.close()
    result = summarise(args, ctx, peak=peak, taps=taps, target_only=target_only, training=training, plain=plain,
                       target_line=target.describe(), plain_packed=plain_packed)
    result["objective"] = parts.objective.describe()
    result["variants"] = [variant_row(name, summarise(args, ctx, peak=peak, taps=taps, target_only=target_only,
                                                      training=figures, plain=plain, target_line="",
                                                      plain_packed=plain_packed), peak_gib, architecture, objective)
                          for name, figures, peak_gib, architecture, objective in measured]
    if len(measured) > 1:
        first = result["variants"][0]["tok_per_s"]
        for row in result["variants"]:
            row["tok_per_s_vs_first"] = row["tok_per_s"] / first
    result["architecture"] = parts.architecture
    if args.simulate_shards:
        result["memory_plan"] = planned_memory(args, target, parts.drafter, parts.objective, ctx, names[-1])
    if ctx.is_main:
        print(json.dumps(result) if args.json else format_table(result), flush=True)
        if "memory_plan" in result and not args.json:
            print("\n".join(result["memory_plan"]["lines"]), flush=True)
        if table:
            print(table, file=sys.stderr)
    if ctx.world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
