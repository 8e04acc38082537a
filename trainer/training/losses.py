"""The training objectives beyond plain cross-entropy, in chunked form (config `loss:` and `slot_weights:`).

Per labelled slot, q is the drafter's distribution, y the target's token (the data's) and p the target's own
distribution at that position (only kl/tv/nla/lk_hybrid need p):
- ce: -log q(y), weighted per slot;
- kl: KL(p || q); tv: 1 - alpha with alpha = sum_v min(p_v, q_v), the acceptance rate of speculative sampling;
  nla: -log alpha; lk_hybrid: lam * KL + (1 - lam) * TV, lam = exp(-3 alpha) detached (KL leads from a cold start,
  TV takes over as acceptance rises);
- cap: per block 1 - E[accepted prefix] / (B - 1), E[accepted prefix] = sum_k prod_{i<=k} q_i(y_i) (greedy
  verification), mixed with the block's CE by lam = exp(-3 mean_k q_k(y_k)) detached: an acceptance objective gives
  almost no gradient while q(y) is near 0 everywhere, so CE carries the cold start.

Slot weights (decay or D-PACE) weigh the per-slot terms; ce/kl/tv/nla/lk_hybrid are normalised by the sum of the
decay weights (as the plain CE is) or, for D-PACE, by the number of supervised slots (its weights are not
normalised: a block the drafter gets right weighs more); cap by the number of blocks.

Chunks hold whole blocks, so every term, the D-PACE weights and cap's per-block products are computed inside one
chunk: the [blocks * (B-1), vocab] logits never exist whole. Every term reads three numbers per row (log q(y),
KL, alpha: RowStats), so a chunk passes over its [rows, vocab] tensors a few times without autograd (p comes
from the same product and log-softmax as q, the target's rows stacked under the drafter's), runs autograd over
[rows] tensors only, composes the logits' gradient in closed form (chunk_math.py, compiled into fused passes over
the bf16 logits on a GPU) and keeps only the gradient with respect to the drafter's hidden states. No library's
fused kernel fits here:
liger-kernel's and cut-cross-entropy's fused linear cross-entropy take no per-row weights, and none computes TV,
the acceptance prefix or D-PACE; the default `ce` keeps its own fused-by-hand path (objective.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from trainer.objectives import (DEFAULT_DPACE_ALPHA, DEFAULT_LOSS, DEFAULT_SLOT_WEIGHTS, DISTRIBUTION_OBJECTIVES,
                                objective_text)
from trainer.training import chunk_math
from trainer.training.selector_objective import chunk_candidates

# fp32 [rows, vocab] tensors one chunk holds at once (its autograd graph keeps several): 256 MiB each. Not
# smaller: each chunk costs a few ms of Python and kernel launches (an 8B vocabulary gives ~110 chunks a step)
ROW_VOCAB_PER_CHUNK = 2 ** 26
LAMBDA_RATE = 3.0   # lam = exp(-3 alpha), as the LK losses paper's hybrid


class ChunkedLoss(NamedTuple):
    """What a chunked loss gives the step: the loss (differentiable), per-row top-1 correctness, each term's value
    before its weight, and with top_k > 0 each row's (unary logits, ids) [rows, K] for DFlash2's selector."""

    loss: torch.Tensor
    correct: torch.Tensor
    terms: dict[str, torch.Tensor]
    candidates: tuple[torch.Tensor, torch.Tensor] | None = None


CountShare = Callable[[torch.Tensor], torch.Tensor]


def local_count(count: torch.Tensor) -> torch.Tensor:
    """One process: its counts are the global ones."""
    return count


def no_candidates(rows: int, top_k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate buffers a chunk loop fills ([rows, K] fp32 logits and int64 ids; K = 0 when none are asked)."""
    return (torch.empty(rows, top_k, dtype=torch.float32, device=device),
            torch.empty(rows, top_k, dtype=torch.long, device=device))


@dataclass(frozen=True)
class Objective:
    """What a training step optimises: {term: weight} and how slots are weighed; the defaults are the config's."""

    weights: dict[str, float] = field(default_factory=lambda: {DEFAULT_LOSS: 1.0})
    slot_weights: str = DEFAULT_SLOT_WEIGHTS   # "dpace" or "decay"
    dpace_alpha: float = DEFAULT_DPACE_ALPHA

    @classmethod
    def from_config(cls, cfg) -> "Objective":
        return cls(cfg.loss_weights(), cfg.slot_weights, cfg.dpace_alpha)

    @property
    def needs_target_distribution(self) -> bool:
        # a term at weight 0 is still computed and logged: a way to watch, say, tv while training on ce
        return any(name in DISTRIBUTION_OBJECTIVES for name in self.weights)

    @property
    def is_plain_ce(self) -> bool:
        """Today's objective, which has a faster hand-written path (objective.ChunkedLinearCrossEntropy)."""
        return self.weights == {"ce": 1.0} and self.slot_weights == "decay"

    def describe(self) -> str:
        return objective_text(self.weights, self.slot_weights)


# The first DFlash recipe (ce, decay slot weights): what the loss function computes when given no objective,
# on the fast plain-CE path; a training run always passes the one its config names.
PLAIN_CE = Objective({"ce": 1.0}, "decay")


def dpace_weights(log_q_y: torch.Tensor, supervised: torch.Tensor, alpha: float) -> torch.Tensor:
    """[blocks, slots] D-PACE weights (arXiv 2605.18810): w_k = sum_{j>=k} prod_{i<=j} c_i over supervised slots,
    c_i = (1 - alpha) q_i(y_i) + alpha the smoothed confidence (1 at an unsupervised slot, which gets weight 0).
    w_k is the derivative of the block's expected accepted length by log c_k: a slot weighs as much as the
    acceptance it gates. Detached: it weighs the loss, it is not optimised."""
    with torch.no_grad():
        mask = supervised.to(torch.float32)
        confidence = torch.where(supervised, (1 - alpha) * log_q_y.float().exp() + alpha, torch.ones_like(mask))
        reach = torch.cumprod(confidence, dim=-1) * mask
        return reach.flip(-1).cumsum(-1).flip(-1) * mask


def expected_accepted_prefix(log_q_y: torch.Tensor, supervised: torch.Tensor) -> torch.Tensor:
    """[blocks]: sum_k prod_{i<=k} q_i(y_i) for log q_i(y_i) [blocks, slots]; an unsupervised slot ends the prefix.
    The products are exponentiated cumulative sums of log q: no underflowing product of many small numbers."""
    reached = torch.cumprod(supervised.to(log_q_y.dtype), dim=-1)
    return (torch.cumsum(log_q_y * supervised, dim=-1).exp() * reached).sum(-1)


def acceptance_rate(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """[rows]: alpha = sum_v min(p_v, q_v)."""
    return torch.minimum(log_p, log_q).exp().sum(-1)


def forward_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """[rows]: KL(p || q) = sum_v p_v (log p_v - log q_v)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@dataclass(frozen=True)
class Normalisers:
    """The whole batch's denominators, known before the first chunk: the per-slot terms' and cap's."""

    slots: torch.Tensor
    blocks: torch.Tensor


class RowStats(NamedTuple):
    """What the terms read of one chunk's [rows, vocab] distributions, per row: log q(y), KL(p || q) and
    alpha = sum_v min(p_v, q_v) (None where no term asks for it)."""

    log_q_y: torch.Tensor
    kl: torch.Tensor | None = None
    alpha: torch.Tensor | None = None


def needs(objective: Objective) -> tuple[bool, bool]:
    """Whether the objective's terms read KL and alpha."""
    names = objective.weights
    return "kl" in names or "lk_hybrid" in names, any(name in names for name in ("tv", "nla", "lk_hybrid"))


def row_stats(log_q: torch.Tensor, log_p: torch.Tensor | None, labels: torch.Tensor,
              objective: Objective) -> RowStats:
    """RowStats from [rows, vocab] log-probabilities, differentiable in log_q (the definition the chunk loop's
    gradient is held to)."""
    need_kl, need_alpha = needs(objective) if log_p is not None else (False, False)
    return RowStats(log_q.gather(1, labels[:, None]).squeeze(1), forward_kl(log_p, log_q) if need_kl else None,
                    acceptance_rate(log_p, log_q) if need_alpha else None)


def chunk_terms(stats: RowStats, supervised: torch.Tensor, decay: torch.Tensor, objective: Objective, slots: int,
                norms: Normalisers) -> dict[str, torch.Tensor]:
    """Each objective term's share of the batch from one chunk of whole blocks (differentiable in the row
    statistics): supervised/decay [rows], rows = blocks * slots."""
    log_q_y = stats.log_q_y * supervised
    blocks = supervised.shape[0] // slots
    by_block = (blocks, slots)
    if objective.slot_weights == "dpace":
        weight = dpace_weights(log_q_y.detach().view(by_block), supervised.view(by_block),
                               objective.dpace_alpha).flatten()
    else:
        weight = decay * supervised
    terms: dict[str, torch.Tensor] = {}
    names = objective.weights
    if "ce" in names:
        terms["ce"] = -(weight * log_q_y).sum() / norms.slots
    per_slot = {}
    if stats.kl is not None:
        per_slot["kl"] = stats.kl
    if stats.alpha is not None:
        alpha = stats.alpha
        per_slot["tv"] = 1 - alpha
        per_slot["nla"] = -torch.log(alpha.clamp(min=torch.finfo(alpha.dtype).tiny))
        if stats.kl is not None:
            lam = torch.exp(-LAMBDA_RATE * alpha).detach()
            per_slot["lk_hybrid"] = lam * stats.kl + (1 - lam) * (1 - alpha)
    for name, value in per_slot.items():
        if name in names:
            terms[name] = (weight * value).sum() / norms.slots
    if "cap" in names:
        terms["cap"] = cap_blocks(log_q_y.view(by_block), supervised.view(by_block), weight.view(by_block),
                                  slots).sum() / norms.blocks
    return terms


def cap_blocks(log_q_y: torch.Tensor, supervised: torch.Tensor, weight: torch.Tensor, slots: int) -> torch.Tensor:
    """[blocks]: (1 - lam) (1 - E[accepted prefix] / slots) + lam CE_block, lam = exp(-3 mean confidence) detached;
    0 for a padding block (no supervised slot)."""
    mask = supervised.to(log_q_y.dtype)
    count = mask.sum(-1)
    prefix = expected_accepted_prefix(log_q_y, supervised)
    ce = -(weight * log_q_y).sum(-1) / weight.sum(-1).clamp(min=torch.finfo(weight.dtype).tiny)
    confidence = (log_q_y.detach().exp() * mask).sum(-1) / count.clamp(min=1)
    lam = torch.exp(-LAMBDA_RATE * confidence)
    return ((1 - lam) * (1 - prefix / slots) + lam * ce) * (count > 0)


class ChunkedObjective(torch.autograd.Function):
    """sum_t weight_t * term_t over chunks of whole blocks; also each term's value and per-row top-1 correctness.

    `target_hidden` [rows, H] (the target's final-normed hidden state at each slot's position, or None) goes
    through the same frozen LM head as the drafter's, in the same product and the same log-softmax (its rows
    stacked under the drafter's): p costs no pass of its own. Every term is a function of per-row statistics
    (RowStats), so autograd runs over [rows] tensors only: the gradient of the chunk's logits is composed from
    the statistics' gradients in closed form (chunk_logit_gradient), and with respect to `hidden` it is taken per
    chunk in the forward pass; the head and the target get none."""

    @staticmethod
    def forward(ctx, hidden, head, target_hidden, labels, supervised, decay, objective: Objective, slots: int,
                norms: Normalisers, chunk_rows: int, top_k: int, math: chunk_math.ChunkMath):
        need_grad = ctx.needs_input_grad[0]
        names = list(objective.weights)
        need_kl, need_alpha = needs(objective) if target_hidden is not None else (False, False)
        values = torch.zeros(len(names), dtype=torch.float32, device=hidden.device)
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        unary, ids = no_candidates(hidden.shape[0], top_k, hidden.device)
        grad_hidden = torch.zeros_like(hidden) if need_grad else None
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            piece, label = hidden[rows], labels[rows]
            stacked = piece if target_hidden is None else torch.cat([piece, target_hidden[rows].to(piece.dtype)])
            logits = stacked.to(head.dtype) @ head.t()
            if top_k:
                unary[rows], ids[rows] = chunk_candidates(logits[:piece.shape[0]], label, top_k)
            found = math.figures(logits, label, need_kl, need_alpha, whole_rows=chunk_rows)
            correct[rows] = found.argmax == label
            stats = RowStats(found.log_q_y, found.kl, found.alpha)
            leaves = RowStats(*(None if t is None else t.detach().requires_grad_(need_grad) for t in stats))
            with torch.enable_grad():
                terms = chunk_terms(leaves, supervised[rows], decay[rows], objective, slots, norms)
                total = sum(objective.weights[name] * terms[name] for name in names)
                if need_grad:
                    present = [t for t in leaves if t is not None]
                    grads = iter(torch.autograd.grad(total, present, allow_unused=True))
                    y_coef, k_coef, a_coef = (None if t is None else next(grads) for t in leaves)
            if need_grad:
                grad_logits = math.logit_gradient(
                    logits, found.lse, label, torch.zeros_like(found.log_q_y) if y_coef is None else y_coef,
                    k_coef, a_coef, found.shared_sum, whole_rows=chunk_rows)
                grad_hidden[rows] = (grad_logits @ head).to(hidden.dtype)
            del logits
            values += torch.stack([terms[name].detach() for name in names])
        ctx.save_for_backward(grad_hidden)
        ctx.mark_non_differentiable(values, correct, unary, ids)
        total = (values * torch.tensor([objective.weights[n] for n in names], device=values.device)).sum()
        return total, values, correct, unary, ids

    @staticmethod
    def backward(ctx, grad_total, grad_values, grad_correct, grad_unary, grad_ids):
        (grad_hidden,) = ctx.saved_tensors
        return (grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None, None, None, None, None,
                None, None, None)


def whole_chunk_blocks(vocab: int, slots: int) -> int:
    """The blocks of a whole chunk: as many as keep its [rows, vocab] tensors at ROW_VOCAB_PER_CHUNK elements."""
    return max(1, ROW_VOCAB_PER_CHUNK // (vocab * slots))


def chunked_objective(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, supervised: torch.Tensor,
                      decay: torch.Tensor, objective: Objective, *, slots: int,
                      target_hidden: torch.Tensor | None = None, chunk_blocks: int | None = None,
                      top_k: int = 0, count_share: CountShare = local_count,
                      math: chunk_math.ChunkMath | None = None) -> ChunkedLoss:
    """The loss, correct[rows] and {term: value} for hidden [rows, H] in block order (rows = blocks * slots), the
    LM head weight [V, H], labels (any valid id where unsupervised), supervised (bool), decay [rows]; with
    top_k > 0 also each row's top-k candidates (selector_objective.chunk_candidates) from the same logits.
    `count_share` turns this rank's normalising counts into its share of the global ones (distributed.rank_share);
    `math`: how a chunk's [rows, vocab] work runs (chunk_math.DEFAULT: compiled on a GPU)."""
    if objective.needs_target_distribution and target_hidden is None:
        raise ValueError(f"objective {objective.describe()} needs the target's hidden states")
    if chunk_blocks is None:
        chunk_blocks = whole_chunk_blocks(head.shape[0], slots)
    tiny = torch.finfo(torch.float32).tiny
    if objective.slot_weights == "dpace":
        slot_norm = count_share(supervised.sum().float()).clamp(min=1)
    else:
        slot_norm = count_share((decay * supervised).sum().float()).clamp(min=tiny)
    blocks = count_share(supervised.view(-1, slots).any(-1).sum().float()).clamp(min=1)
    norms = Normalisers(slots=slot_norm, blocks=blocks)
    target = None if target_hidden is None or not objective.needs_target_distribution else target_hidden
    loss, values, correct, unary, ids = ChunkedObjective.apply(hidden, head, target, labels, supervised,
                                                               decay.float(), objective, slots, norms,
                                                               chunk_blocks * slots, top_k,
                                                               math or chunk_math.DEFAULT)
    return ChunkedLoss(loss, correct, dict(zip(objective.weights, values.unbind())),
                       (unary, ids) if top_k else None)
