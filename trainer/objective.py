"""The DFlash training objective: anchor sampling, block labels, decay-weighted chunked cross-entropy, metrics."""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100
# rows of logits per chunk are chosen so that one chunk holds about this many fp32 logits (512 MiB)
LOGITS_PER_CHUNK = 2 ** 27


@dataclass
class StepOutput:
    loss: torch.Tensor        # scalar, differentiable
    acc: float                # top-1 accuracy over supervised slots
    streak: float             # mean accepted prefix length per block (tau = streak + 1)
    n_supervised: int
    n_blocks: int


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """[B, A] sorted anchor positions, -1 where a sequence has fewer than A; A = the most any row got (>= 1).

    An anchor is a position a with loss_mask[a] and loss_mask[a + 1]; up to `num_anchors` per sequence are drawn
    without replacement from `generator` (a CPU generator, so the draw is the same on every device)."""
    valid = (loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()).cpu()
    rows = []
    for row in valid:
        candidates = row.nonzero().squeeze(1)
        if len(candidates) > num_anchors:
            pick = torch.randperm(len(candidates), generator=generator)[:num_anchors]
            candidates = candidates[pick].sort().values
        rows.append(candidates)
    width = max(1, max(len(r) for r in rows))
    anchors = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        anchors[i, :len(row)] = row
    return anchors.to(loss_mask.device)


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
    softmax), so the backward pass only scales it. `weight` (the frozen LM head) gets no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, chunk_rows: int):
        need_grad = ctx.needs_input_grad[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = (hidden[rows].to(weight.dtype) @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            label = labels[rows]
            total += ((lse - logits.gather(1, label[:, None]).squeeze(1)) * weights[rows]).sum()
            correct[rows] = logits.argmax(dim=-1) == label
            if need_grad:
                probs = torch.exp(logits - lse[:, None])
                probs[torch.arange(len(label), device=label.device), label] -= 1.0
                probs *= weights[rows][:, None]
                grad_hidden[rows] = (probs.to(weight.dtype) @ weight).to(hidden.dtype)
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(correct)
        return total, correct

    @staticmethod
    def backward(ctx, grad_total, grad_correct):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None


def chunked_weighted_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                        *, chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss normalised by sum(weights), correct[N]) for hidden [N, H] and the LM head weight [V, H]."""
    if chunk_rows is None:
        chunk_rows = max(1, LOGITS_PER_CHUNK // weight.shape[0])
    normalised = (weights / weights.sum()).float()
    return ChunkedLinearCrossEntropy.apply(hidden, weight, labels, normalised, chunk_rows)


def accepted_streak(correct: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[B, A]: per block sum_k prod_{i<=k} correct_i (an unsupervised slot ends the streak)."""
    hits = torch.zeros(labels.shape, dtype=torch.int32, device=labels.device)
    hits[labels != IGNORE] = correct.to(torch.int32)
    return hits.cumprod(dim=-1).sum(dim=-1)


def add_feature_noise(features: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    # the seed comes from the step's generator so a resumed run adds the same noise as an uninterrupted one
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    device_generator = torch.Generator(device=features.device).manual_seed(seed)
    noise = torch.randn(features.shape, generator=device_generator, device=features.device, dtype=torch.float32)
    return features + (noise * std).to(features.dtype)


def dflash_step(drafter, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                num_anchors: int, block_size: int, gamma: float, noise: float, generator: torch.Generator,
                chunk_rows: int | None = None) -> StepOutput:
    """One training forward: loss (differentiable) and metrics for a batch of target features.

    `drafter` may be wrapped (DDP, torch.compile): the forward goes through the wrapper."""
    from trainer.drafter import unwrap

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
    n_supervised = int(supervised.sum())
    n_blocks = int((anchors >= 0).sum())
    if n_supervised == 0:
        # keeps every parameter in the graph, so DDP ranks with an empty batch still all-reduce
        return StepOutput(loss=hidden.sum() * 0.0, acc=0.0, streak=0.0, n_supervised=0, n_blocks=n_blocks)
    slot_weights = decay_weights(block_size, gamma, device=labels.device).expand(labels.shape)
    loss, correct = chunked_weighted_ce(hidden[supervised], inner.lm_head.weight, labels[supervised],
                                        slot_weights[supervised], chunk_rows=chunk_rows)
    streaks = accepted_streak(correct, labels)[anchors >= 0]
    return StepOutput(loss=loss, acc=float(correct.float().mean()), streak=float(streaks.float().mean()),
                      n_supervised=n_supervised, n_blocks=n_blocks)

