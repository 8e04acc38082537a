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

# columns per group of grouped_topk's first stage; a row shorter than two groups takes one plain topk
TOPK_GROUP = 1024


def grouped_topk(values: torch.Tensor, k: int, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """values.topk(k, dim=-1) for [rows, V] in two stages: each group of `group` columns' top k, then the top k of
    those. The same values in the same order (ties may pick other columns); on an H100 a plain topk of 16 over a
    152K vocabulary took 3.3 ms per loss chunk, 164 ms of an 8B step, one thread block walking each long row."""
    rows, width = values.shape
    group = group or TOPK_GROUP
    if k > group or width < 2 * group:
        return values.topk(k, dim=-1)
    groups = -(-width // group)
    padded = F.pad(values, (0, groups * group - width), value=float("-inf")) if groups * group != width else values
    group_values, group_ids = padded.view(rows, groups, group).topk(k, dim=-1)           # [rows, groups, k]
    offsets = torch.arange(0, groups * group, group, device=values.device)[:, None]
    top_values, where = group_values.flatten(1).topk(k, dim=-1)
    return top_values, (group_ids + offsets).flatten(1).gather(1, where)


@torch.no_grad()
def chunk_candidates(logits: torch.Tensor, labels: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(unary logits in fp32, token ids) [rows, K] of one chunk of LM-head logits [rows, V]: each row's top K, with
    the row's label in the last place where it is not among them. The training losses call it on the logits of
    each chunk they compute anyway, before they turn them into probabilities: no second pass over the head."""
    top_values, top_ids = grouped_topk(logits, top_k)
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
