"""The [rows, vocab] work of one loss chunk (losses.ChunkedObjective), as two functions of the chunk's logits in the
LM head's dtype: its per-row statistics, and the logits' gradient from what autograd over those statistics gives.
Neither keeps a [rows, vocab] tensor: the gradient recomputes q = exp(z - lse) (and p) from the logits.

On a GPU both run torch.compile'd for the shape of a whole chunk (one graph per shape and objective; every chunk
of a step but its last has that shape, and the last runs eager), where each becomes one or two fused passes over
the bf16 logits. Eager, every step below is a pass of its own over fp32 [rows, vocab] tensors, which is what a
chunk cost before (a log-softmax into fp32, exp into another, the gradient composed in four more): at 8B the
memory traffic of those passes, not the LM head's products, was most of the loss's time.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class ChunkFigures(NamedTuple):
    """Per row of one chunk (drafter's rows first; `lse` also over the target's rows stacked under them):
    log-sum-exp of the logits, log q(y), KL(p || q), alpha = sum_v min(p_v, q_v), sum_v of q where q < p (what
    alpha's gradient needs) and the argmax (top-1 correctness). None where the objective asks for no p."""

    lse: torch.Tensor
    log_q_y: torch.Tensor
    argmax: torch.Tensor
    kl: torch.Tensor | None
    alpha: torch.Tensor | None
    shared_sum: torch.Tensor | None


def figures(logits: torch.Tensor, labels: torch.Tensor, need_kl: bool, need_alpha: bool) -> ChunkFigures:
    """ChunkFigures of logits [rows (+ rows of the target), vocab]; labels [rows]. Computed in fp32."""
    rows = labels.shape[0]
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    log_q = z[:rows] - lse[:rows, None]
    log_q_y = log_q.gather(1, labels[:, None]).squeeze(1)
    argmax = logits[:rows].argmax(dim=-1)
    kl = alpha = shared_sum = None
    if need_kl or need_alpha:
        log_p = z[rows:] - lse[rows:, None]
        p = log_p.exp()
        if need_kl:
            kl = (p * (log_p - log_q)).sum(-1)
        if need_alpha:
            q = log_q.exp()
            alpha = torch.minimum(p, q).sum(-1)
            # a tie, which two different products' fp32 log-probabilities almost never give, counts as q >= p
            shared_sum = torch.where(log_q < log_p, q, 0.0).sum(-1)
    return ChunkFigures(lse, log_q_y, argmax, kl, alpha, shared_sum)


def logit_gradient(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, y_coef: torch.Tensor,
                   k_coef: torch.Tensor | None, a_coef: torch.Tensor | None,
                   shared_sum: torch.Tensor | None) -> torch.Tensor:
    """dL/dz [rows, vocab] in the logits' dtype for z the drafter's logits, from dL/d(each row statistic): Y for
    log q(y), K for KL, A for alpha (None where the objective has no such term). With
    G = dL/d log q = Y onehot(y) - K p + A shared (shared = q where q < p), dz = G - q sum(G), and
    sum(G) = Y - K + A sum(shared)."""
    rows = labels.shape[0]
    z = logits.float()
    log_q = z[:rows] - lse[:rows, None]
    q = log_q.exp()
    shift = -y_coef
    if k_coef is not None:
        shift = shift + k_coef
    if a_coef is not None:
        shift = shift - a_coef * shared_sum
    grad = q * shift[:, None]
    if k_coef is not None or a_coef is not None:
        log_p = z[rows:] - lse[rows:, None]
        if a_coef is not None:
            grad = grad + torch.where(log_q < log_p, q, 0.0) * a_coef[:, None]
        if k_coef is not None:
            grad = grad - log_p.exp() * k_coef[:, None]
    grad = grad.scatter_add(1, labels[:, None], y_coef[:, None].to(grad.dtype))
    return grad.to(logits.dtype)


class ChunkMath:
    """`figures` and `logit_gradient` as a chunk of this shape runs them: compiled (static shapes) for the
    declared whole-chunk shape on a GPU, eager for any other shape, on the CPU, and with `compiled` off."""

    def __init__(self, compiled: bool = True) -> None:
        self.compiled = compiled

    def _choose(self, fn, labels: torch.Tensor, whole_rows: int):
        """The compiled fn for a whole chunk (its drafter's rows, `labels`, number `whole_rows`) on a GPU."""
        if self.compiled and labels.device.type == "cuda" and labels.shape[0] == whole_rows:
            return _compiled(fn)
        return fn

    def figures(self, logits, labels, need_kl: bool, need_alpha: bool, *, whole_rows: int) -> ChunkFigures:
        return self._choose(figures, labels, whole_rows)(logits, labels, need_kl, need_alpha)

    def logit_gradient(self, logits, lse, labels, y_coef, k_coef, a_coef, shared_sum, *,
                       whole_rows: int) -> torch.Tensor:
        return self._choose(logit_gradient, labels, whole_rows)(logits, lse, labels, y_coef, k_coef, a_coef,
                                                                shared_sum)


@functools.cache
def _compiled(fn):
    return torch.compile(fn, dynamic=False)


# what the trainer's chunks run; bench_train's `+eager-loss` variants switch it off to time the eager passes
DEFAULT = ChunkMath()
