"""flex_attention compiled up front on small synthetic batches, so that the first real step (and every later shape)
reuses those kernels instead of looking hung for minutes; each layer type's compile is a start-up stage line.
"""
from __future__ import annotations

import time

from trainer.training.startup import stage_line


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


def conv_shapes(batch_sizes, anchors_per_sequence, block_size: int) -> list[tuple[int, int]]:
    """The (batch, block tokens) of the drafter's block convolutions for each bucket's full batches
    (`anchors_per_sequence(batch size)`: the anchors a batch of that size draws per sequence)."""
    return sorted({(size, anchors_per_sequence(size) * block_size) for size in batch_sizes})


def compile_block_conv_shapes(drafter, shapes, *, feature_dtype, autocast, say) -> int:
    """Run one BlockConv forward and backward at each of `shapes` (kernels.compile_block_convs's), both sides, so
    every bucket's static graph is compiled before the first step; returns how many shapes were warmed (0 for a
    drafter without convolutions). Leaves no gradient behind."""
    import torch

    convs = [module for module in drafter.modules() if type(module).__name__ == "BlockConv"]
    if not convs or not shapes:
        return 0
    conv, hidden = convs[0], drafter.config.hidden_size
    device = conv.base_kernel.device
    say(stage_line(f"compiling the block convolution for {len(shapes)} bucket shapes"))
    began = time.perf_counter()
    for batch, tokens in shapes:
        for side in (0, 1):
            y = torch.zeros(batch, tokens, hidden, device=device, dtype=feature_dtype, requires_grad=True)
            kernels = torch.zeros(batch, tokens // conv.block_size, conv.block_size, 2, conv.kernel_size,
                                  conv.groups, device=device, dtype=feature_dtype, requires_grad=True)
            with autocast:
                out = conv(y, kernels, side)
            out.backward(torch.ones_like(out))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    drafter.zero_grad(set_to_none=True)
    say(f"  compiled {len(shapes)} shapes in {time.perf_counter() - began:.1f}s")
    return len(shapes)


def compile_loss_chunks(drafter, objective, *, say) -> bool:
    """The loss's [rows, vocab] work of a whole chunk (training/chunk_math.py) compiled before the first step, on
    one synthetic whole chunk with the target's rows where the objective reads p; False where nothing compiles
    (the plain CE's own path, or off a GPU). Leaves no gradient behind."""
    import torch

    from trainer.training.losses import chunked_objective, whole_chunk_blocks

    head = drafter.lm_head.weight
    if objective.is_plain_ce or head.device.type != "cuda":
        return False
    slots = drafter.config.block_size - 1
    rows = whole_chunk_blocks(head.shape[0], slots) * slots
    say(stage_line(f"compiling the loss's chunk ({objective.describe()})"))
    began = time.perf_counter()
    hidden = torch.zeros(rows, head.shape[1], device=head.device, dtype=head.dtype, requires_grad=True)
    target = hidden.detach() if objective.needs_target_distribution else None
    labels = torch.zeros(rows, dtype=torch.long, device=head.device)
    ones = torch.ones(rows, device=head.device)
    out = chunked_objective(hidden, head.detach(), labels, ones.bool(), ones, objective, slots=slots,
                            target_hidden=target)
    out.loss.backward()
    torch.cuda.synchronize(head.device)
    say(f"  compiled in {time.perf_counter() - began:.1f}s")
    return True


def compile_target_layers(target, *, autocast, say) -> None:
    """The target's compiled decoder layers (TargetModel.compile_layers) run once before the first step on small
    synthetic batches: one of two right-padded rows (packed where the target packs) and one of a single row (never
    packed), the two graphs the feature pass can take; the graph's token count is dynamic, so real batches compile
    nothing more."""
    import torch

    say(stage_line("compiling the target's layers"))
    began = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    for rows, columns in ((2, 96), (1, 80)):
        input_ids = torch.randint(0, target.config.vocab_size, (rows, columns), generator=generator)
        mask = torch.ones(rows, columns, dtype=torch.long)
        mask[1:, columns // 2:] = 0
        with autocast:
            target.features(input_ids, mask)
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    say(f"  compiled in {time.perf_counter() - began:.1f}s")
