"""DFlash2's selector objective: a K-way cross-entropy over each drafted slot's unary top-K candidates.

The public DFlash2 sources do not say what the selector is trained on; trainer/planning/dflash2.py keeps our choice
(and its weight) in one place. The previous token is teacher-forced (the anchor at slot 1, else the text's token
before the slot), as the chain it scores at inference follows accepted tokens; a label outside the top K replaces
the weakest candidate so that every supervised slot has a target. The unary logits and the hidden states enter
detached: this term trains the selector alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.planning.dflash2 import SELECTOR_LOSS_WEIGHT


TOPK_BLOCK = 128      # vocabulary columns per block of blockwise_topk
BLOCKWISE = True      # False: torch.topk over the whole row (bench_train's `auto+torch-topk`, the way before)


def blockwise_topk(logits: torch.Tensor, k: int, block: int = TOPK_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(logits, k) of rows [rows, V] (the same values, best first; among equal values the ids may differ)
    in two short passes: each block of `block` columns' maximum, then the top k of the k blocks with the largest
    maxima (every one of the row's k best lies in one of them: a block outside them has k larger values before
    its best). torch.topk's radix select over 152K columns took 0.56 ms a loss chunk in an 8B step on an H100,
    many times its bytes' time; this takes about half (bench_dflash2_parts.py)."""
    rows, vocab = logits.shape
    whole = vocab // block
    if whole <= k:
        return logits.topk(k, dim=-1)
    maxima = logits[:, :whole * block].reshape(rows, whole, block).amax(dim=-1)
    if vocab > whole * block:   # the last, shorter block
        maxima = torch.cat([maxima, logits[:, whole * block:].amax(dim=-1, keepdim=True)], dim=1)
    blocks = maxima.topk(k, dim=-1).indices
    columns = (blocks[..., None] * block + torch.arange(block, device=logits.device)).flatten(1)
    values = logits.gather(1, columns.clamp(max=vocab - 1))
    values = values.masked_fill(columns >= vocab, float("-inf"))   # past the end of the shorter block
    top_values, at = values.topk(k, dim=-1)
    return top_values, columns.gather(1, at)


@torch.no_grad()
def chunk_candidates(logits: torch.Tensor, labels: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(unary logits in fp32, token ids) [rows, K] of one chunk of LM-head logits [rows, V]: each row's top K, with
    the row's label in the last place where it is not among them. The training losses call it on the logits of
    each chunk they compute anyway, before they turn them into probabilities: no second pass over the head."""
    top_values, top_ids = blockwise_topk(logits, top_k) if BLOCKWISE else logits.topk(top_k, dim=-1)
    label = labels[:, None]
    absent = ~(top_ids == label).any(dim=-1)
    # torch.where, not a boolean-mask assignment: a mask index is a nonzero(), which waits for the GPU, and once a
    # chunk (~50 a step at 8B) the loop's Python then ran with the device idle
    top_ids[:, -1] = torch.where(absent, label[:, 0], top_ids[:, -1])
    top_values[:, -1] = torch.where(absent, logits.gather(1, label)[:, 0], top_values[:, -1])
    return top_values.float(), top_ids


def previous_tokens(input_ids: torch.Tensor, anchors: torch.Tensor, drafted: int) -> torch.Tensor:
    """[B, A, drafted]: the token before each drafted slot, teacher-forced (slot k follows input_ids[a + k - 1])."""
    positions = (anchors.clamp(min=0)[..., None] + torch.arange(drafted, device=anchors.device))
    positions = positions.clamp(max=input_ids.shape[1] - 1)
    return input_ids.gather(1, positions.flatten(1)).view_as(positions)


def selector_loss(drafter, hidden: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor,
                  labels: torch.Tensor, slot_weights: torch.Tensor,
                  candidates: tuple[torch.Tensor, torch.Tensor],
                  count_share=lambda count: count) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss times SELECTOR_LOSS_WEIGHT, correct [B, A, T]: the selector's top score is the label) for the
    drafted slots' final hidden states [B, A, T, H]; labels [B, A, T] (any value where slot_weights is 0);
    `candidates`: (unary logits, ids) [B*A*T, K] as chunk_candidates gives them for these rows and labels;
    `count_share` as in losses.chunked_objective."""
    flat_hidden = hidden.detach().reshape(-1, hidden.shape[-1])
    unary, ids = candidates
    previous = previous_tokens(input_ids, anchors, hidden.shape[2]).reshape(-1, 1)
    scores = drafter.candidate_selector.pair_scores(flat_hidden, previous, ids, unary)[:, 0]   # [N, K]
    target = (ids == labels.reshape(-1, 1)).int().argmax(dim=-1)
    weights = slot_weights.flatten().float()
    loss = (F.cross_entropy(scores, target, reduction="none") * weights).sum()
    loss = loss / count_share(weights.sum()).clamp(min=torch.finfo(weights.dtype).tiny)
    return loss * SELECTOR_LOSS_WEIGHT, (scores.argmax(dim=-1) == target).view(labels.shape)
