"""What happens between `trainer train` and its first step: stage lines with the seconds since the process
started, persistent compile caches, and flex_attention compiled up front on a small batch so that the first
real step (and every later shape) reuses those kernels instead of looking hung for minutes.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from trainer import logformat

_PROCESS_STARTED = time.monotonic()  # close enough to the process start: this module loads with the trainer


def seconds_since_start() -> float:
    return time.monotonic() - _PROCESS_STARTED


def stage_line(stage: str) -> str:
    return logformat.format_startup_line(seconds_since_start(), stage)


def default_compile_caches(environ: dict | None = None) -> dict[str, str]:
    """Point Inductor's and Triton's caches at a directory that survives the process and a container restart
    (their defaults live under /tmp), unless the caller chose one; a second run of the same shapes starts warm.
    `dflashctl launch` sets both under the target's workdir; by hand they default to ~/.cache/dflash."""
    env = os.environ if environ is None else environ
    base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(base / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(base / "triton"))
    return {key: env[key] for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}


def default_cuda_allocator(environ: dict | None = None) -> str:
    """Expandable segments for PyTorch's CUDA allocator unless the caller configured it: the same step at 27B and
    49,152 tokens on an H200 then reserves 122.0 GiB instead of 138.7 (120.2 allocated either way, speed within
    0.5 %), room a rank's NCCL buffers need. Takes effect only before the first CUDA allocation."""
    env = os.environ if environ is None else environ
    return env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def _synthetic_batch(config, batch: int, context_len: int, blocks: int, *, device, dtype, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, context_len, len(config.target_layer_ids) * config.hidden_size,
                           generator=generator).to(device=device, dtype=dtype)
    anchors = torch.stack([torch.randperm(context_len - 1, generator=generator)[:blocks].sort().values
                           for _ in range(batch)]).to(device)
    tokens = torch.randint(0, config.vocab_size, (batch, blocks), generator=generator).to(device)
    return features, tokens, anchors


# (batch, context, blocks): distinct sizes, none 0 or 1 (Dynamo specialises those and unifies equal ones); a
# second shape that differs in every size shows the first compile serves it (else it compiles dynamic here)
WARM_UP_SHAPES = ((2, 300, 24), (3, 430, 37))
SINGLE_SEQUENCE_SHAPE = (1, 520, 45)


def compile_attention(drafter, *, feature_dtype, autocast, say, single_sequence_batches: bool = False) -> int:
    """Run each drafter layer type forward and backward on small synthetic batches, so flex_attention is
    compiled before the first real step and the run says so; returns how many layer types were compiled.
    `single_sequence_batches`: the data has batches of one sequence, a shape the compiler treats apart.

    Runs on the drafter itself, not its DDP wrapper (no gradient sync), under the training autocast (Dynamo
    guards on it), and leaves no gradient behind."""
    import torch

    config = drafter.config
    device = drafter.fc.weight.device
    layer_types = config.resolved_layer_types
    first_of_type = {t: layer_types.index(t) for t in sorted(set(layer_types))}
    shapes = WARM_UP_SHAPES + ((SINGLE_SEQUENCE_SHAPE,) if single_sequence_batches else ())
    for k, (layer_type, index) in enumerate(first_of_type.items(), 1):
        say(stage_line(f"compiling {k}/{len(first_of_type)} (flex_attention, {layer_type} layers)"))
        seconds = []
        for seed, shape in enumerate(shapes):
            began = time.perf_counter()
            features, tokens, anchors = _synthetic_batch(config, *shape, device=device, dtype=feature_dtype,
                                                         seed=seed)
            with autocast:
                hidden = drafter(features, tokens, anchors, layers=[index])
            hidden.float().square().mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - began)
        say(f"  compiled {k}/{len(first_of_type)} in {seconds[0]:.1f}s; other shapes "
            + ", ".join(f"{s:.1f}s" for s in seconds[1:]))
    drafter.zero_grad(set_to_none=True)
    return len(first_of_type)
