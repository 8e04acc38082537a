"""The DFlash training step: anchor sampling, block labels, decay-weighted chunked cross-entropy (the default
objective's own fast path; the others are in losses.py), metrics."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainer.training.losses import (PLAIN_CE, ChunkedLoss, CountShare, Objective, chunked_objective, local_count,
                                     no_candidates)
from trainer.training.selector_objective import chunk_candidates, selector_loss

IGNORE = -100
# rows of logits per chunk are chosen so that one chunk holds about this many fp32 logits (512 MiB)
LOGITS_PER_CHUNK = 2 ** 27


@dataclass
class StepOutput:
    """The step's loss and metrics, all device tensors: reading one as a number waits for the GPU, so a
    training loop sums them as tensors and reads them only when it logs."""

    loss: torch.Tensor          # scalar, differentiable
    acc: torch.Tensor           # top-1 accuracy over supervised slots
    streak: torch.Tensor        # mean accepted prefix length per block (tau = streak + 1)
    n_supervised: torch.Tensor  # int64 scalar
    n_blocks: torch.Tensor      # int64 scalar
    terms: dict[str, torch.Tensor] = field(default_factory=dict)  # each objective term before its weight


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """[B, A] sorted anchor positions, -1 where a sequence has fewer than A; A = min(num_anchors, S - 1).

    An anchor is a position a with loss_mask[a] and loss_mask[a + 1]; up to `num_anchors` per sequence are drawn
    without replacement, uniformly, from `generator` (a CPU generator). Each position gets a random key drawn on
    the CPU, so the draw is the same on every device; the keys of valid positions that sort first are chosen.
    The width depends on the shape alone and nothing is read back to the host: no wait for the GPU."""
    batch, seq_len = loss_mask.shape
    width = max(1, min(num_anchors, seq_len - 1))
    if seq_len < 2:
        return torch.full((batch, 1), -1, dtype=torch.long, device=loss_mask.device)
    valid = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()
    positions = torch.arange(seq_len - 1, dtype=torch.long)
    # distinct keys (random high bits, the position as tie-break): the choice never depends on a sort's ties
    high = 2 ** (62 - seq_len.bit_length())   # key * seq_len + position stays below 2 ** 62
    keys = torch.randint(0, high, valid.shape, generator=generator, dtype=torch.long) * seq_len + positions
    keys = to_device(keys, loss_mask.device).masked_fill(~valid, torch.iinfo(torch.long).max)
    chosen = keys.topk(width, dim=1, largest=False).indices
    chosen = chosen.masked_fill(~valid.gather(1, chosen), seq_len)   # too few valid positions: padding
    anchors = chosen.sort(dim=1).values
    return anchors.masked_fill(anchors == seq_len, -1)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device` without blocking the host (through pinned memory on a GPU)."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def decay_weights(block_size: int, gamma: float, *, device=None) -> torch.Tensor:
    """[Bs-1]: w_k = exp(-(k-1)/gamma) for slots k = 1..Bs-1."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """[B, A, Bs-1]: slot k of the block at anchor a predicts input_ids[a + k]; IGNORE where that position is
    past the sequence, has loss_mask 0, or the block is padding."""
    seq_len = input_ids.shape[1]
    k = torch.arange(1, block_size, device=anchors.device)
    positions = anchors[..., None] + k                                   # [B, A, Bs-1]
    inside = (anchors[..., None] >= 0) & (positions < seq_len)
    flat = positions.clamp(0, seq_len - 1).flatten(1)
    tokens = input_ids.gather(1, flat).view_as(positions)
    supervised = loss_mask.bool().gather(1, flat).view_as(positions) & inside
    return torch.where(supervised, tokens, torch.full_like(tokens, IGNORE))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(hidden_i @ W^T, label_i), never holding more than one chunk of logits.

    The gradient with respect to `hidden` is computed chunk by chunk in the forward pass (it needs the same
    softmax), so the backward pass only scales it. `weight` (the frozen LM head) gets no gradient.

    A chunk's logits stay in the head's dtype and are passed over few times (the profile on an H200 had this
    loss at 425 ms of a 2.5 s step against 150 ms of matrix products): one fused log-softmax into fp32, an argmax,
    then exp written back over the logits as the softmax, minus one at the labels. The weights w scale the
    [rows, hidden] product, not the [rows, vocab] softmax."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, chunk_rows: int, top_k: int):
        need_grad = ctx.needs_input_grad[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        unary, ids = no_candidates(hidden.shape[0], top_k, hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            label, weight_rows = labels[rows], weights[rows]
            logits = hidden[rows].to(weight.dtype) @ weight.t()
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
            total -= (log_probs.gather(1, label[:, None]).squeeze(1) * weight_rows).sum()
            correct[rows] = logits.argmax(dim=-1) == label
            if top_k:   # DFlash2's selector candidates, before the logits' buffer becomes the softmax
                unary[rows], ids[rows] = chunk_candidates(logits, label, top_k)
            if need_grad:
                probs = torch.exp(log_probs, out=logits)            # softmax, over the logits' own buffer
                probs.scatter_add_(1, label[:, None], torch.full_like(probs[:, :1], -1))
                grad_hidden[rows] = ((probs @ weight) * weight_rows[:, None]).to(hidden.dtype)
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(correct, unary, ids)
        return total, correct, unary, ids

    @staticmethod
    def backward(ctx, grad_total, grad_correct, grad_unary, grad_ids):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None, None


def chunked_weighted_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                        *, chunk_rows: int | None = None, top_k: int = 0,
                        count_share: CountShare = local_count) -> ChunkedLoss:
    """The loss normalised by sum(weights) (its one term, ce; `count_share` makes that sum the global one's share)
    and correct[N] for hidden [N, H] and the LM head weight [V, H]; with top_k > 0 each row's top-k candidates from
    the same logits (chunk_candidates)."""
    if chunk_rows is None:
        chunk_rows = max(1, LOGITS_PER_CHUNK // weight.shape[0])
    # a batch without supervised slots has all-zero weights: loss and gradient 0, not NaN
    normalised = (weights / count_share(weights.sum()).clamp(min=torch.finfo(weights.dtype).tiny)).float()
    loss, correct, unary, ids = ChunkedLinearCrossEntropy.apply(hidden, weight, labels, normalised, chunk_rows,
                                                                top_k)
    return ChunkedLoss(loss, correct, {"ce": loss.detach()}, (unary, ids) if top_k else None)


def accepted_streak(correct: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[B, A]: per block sum_k prod_{i<=k} correct_i, for correct [B, A, Bs-1] (an unsupervised slot ends the
    streak)."""
    hits = (correct & (labels != IGNORE)).to(torch.int32)
    return hits.cumprod(dim=-1).sum(dim=-1)


def add_feature_noise(features: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    # the seed comes from the step's generator so a resumed run adds the same noise as an uninterrupted one
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    device_generator = torch.Generator(device=features.device).manual_seed(seed)
    noise = torch.randn(features.shape, generator=device_generator, device=features.device, dtype=torch.float32)
    return features + (noise * std).to(features.dtype)


def slot_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, A, Bs-1]: the position whose target state predicts slot k's token (anchor + k - 1), clamped inside."""
    return (anchors[..., None] + torch.arange(block_size - 1, device=anchors.device)).clamp(min=0)


def gather_rows(states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N, H]: states [B, S, H] at positions [B, ...] (clamped to the sequence), flattened."""
    flat = positions.flatten(1).clamp(max=states.shape[1] - 1)
    return states.gather(1, flat[..., None].expand(-1, -1, states.shape[-1])).reshape(-1, states.shape[-1])


def dflash_step(drafter, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                num_anchors: int, block_size: int, gamma: float, noise: float, generator: torch.Generator,
                chunk_rows: int | None = None, objective: Objective | None = None,
                target_hidden: torch.Tensor | None = None, count_share: CountShare = local_count) -> StepOutput:
    """One training forward: loss (differentiable) and metrics for a batch of target features.

    `drafter` may be wrapped (DDP, torch.compile): the forward goes through the wrapper. `target_hidden`
    [B, S, H]: the target's final-normed hidden states, for objectives against its distribution. Under DDP
    `count_share` (distributed.rank_share) normalises every term by the global batch's counts, not this rank's."""
    from trainer.model.drafter import unwrap

    inner = unwrap(drafter)
    if block_size != inner.config.block_size:
        raise ValueError(f"block_size {block_size} differs from the drafter's {inner.config.block_size}")
    anchors = sample_anchors(loss_mask, num_anchors, generator)
    if inner.training and noise > 0:
        features = add_feature_noise(features, noise, generator)
    anchor_tokens = input_ids.gather(1, anchors.clamp(min=0))
    hidden = drafter(features, anchor_tokens, anchors)[:, :, 1:]          # [B, A, Bs-1, H]
    labels = block_labels(input_ids, loss_mask, anchors, block_size)
    supervised = labels != IGNORE
    # every slot goes through the loss, unsupervised ones with weight 0: selecting the supervised rows would
    # make the shape depend on the data and wait for the GPU to know it
    decay = decay_weights(block_size, gamma, device=labels.device)
    slot_weights = decay * supervised
    objective = objective or PLAIN_CE
    rows = hidden.reshape(-1, hidden.shape[-1])
    top_k = getattr(inner, "selector_top_k", None) or 0   # DFlash2: its selector's candidates come with the loss
    if objective.is_plain_ce:
        out = chunked_weighted_ce(rows, inner.lm_head.weight, labels.clamp(min=0).flatten(), slot_weights.flatten(),
                                  chunk_rows=chunk_rows, top_k=top_k, count_share=count_share)
    else:
        target_rows = None
        if objective.needs_target_distribution:
            if target_hidden is None:
                raise ValueError(f"objective {objective.describe()} needs the target's final hidden states")
            target_rows = gather_rows(target_hidden, slot_positions(anchors, block_size))
        chunk_blocks = None if chunk_rows is None else max(1, chunk_rows // (block_size - 1))
        out = chunked_objective(rows, inner.lm_head.weight, labels.clamp(min=0).flatten(), supervised.flatten(),
                                decay.expand_as(labels).flatten(), objective, slots=block_size - 1,
                                target_hidden=target_rows, chunk_blocks=chunk_blocks, top_k=top_k,
                                count_share=count_share)
    loss, terms, correct = out.loss, out.terms, out.correct.view(labels.shape)
    if top_k:
        loss = loss + selector_loss(inner, hidden, input_ids, anchors, labels.clamp(min=0), slot_weights,
                                    out.candidates, count_share=count_share)[0]
    real_blocks = anchors >= 0
    n_supervised, n_blocks = supervised.sum(), real_blocks.sum()
    acc = (correct & supervised).sum() / n_supervised.clamp(min=1)
    streak = (accepted_streak(correct, labels) * real_blocks).sum() / n_blocks.clamp(min=1)
    return StepOutput(loss=loss, acc=acc, streak=streak, n_supervised=n_supervised, n_blocks=n_blocks, terms=terms)
