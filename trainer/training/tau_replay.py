"""τ predicted from training text: speculative-decoding rounds replayed teacher-forced on a batch's own targets.

`streak` (objective.py) is the mean accepted prefix over uniformly drawn anchors. Decoding does not draw its
anchors: each round starts where the last one ended, so easy stretches are crossed in a few long rounds and
hard ones in many one-token rounds, and τ sits well below streak + 1. The replay walks the rounds as decoding
would on the same text: the first anchor is the answer's first (supervised) token, a round at anchor a accepts
the drafter's correct prefix (streak(a) tokens) plus the target's own next token (the bonus), and the next
round starts at a + streak(a) + 1. On a text that is the target's own greedy output, this is exactly the τ of
real speculative decoding (tests/trainer/training/test_tau_replay.py); on other text it is the prediction.

The drafter's streak is computed at every anchor of the replayed sequences in a few no-grad forwards over the
features the step already has (no extra target forward), the rounds are then walked on the host. The same
per-anchor streaks give the acceptance histogram: the share of anchors whose block accepts 0, 1, ..., B-1
drafted tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainer.training.objective import accepted_streak, block_labels

# rows of [block slots x vocabulary] logits one argmax chunk may hold (fp32: 256 MiB)
LOGITS_PER_CHUNK = 2 ** 26


@dataclass
class ReplayTally:
    """Sums over replayed text, so that batches and ranks add up: tokens the rounds kept, rounds, and per
    anchor how many drafted tokens its block accepted (hist[k]: anchors accepting k, k = 0..B-1)."""

    accepted: int = 0
    rounds: int = 0
    hist: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float | None:
        """Tokens kept per round (drafted prefix + bonus, cut at the answer's end); None without rounds."""
        return self.accepted / self.rounds if self.rounds else None

    def shares(self) -> list[float]:
        """The histogram as shares of all anchors."""
        total = sum(self.hist)
        return [round(count / total, 4) for count in self.hist] if total else []

    def add(self, other: "ReplayTally") -> "ReplayTally":
        width = max(len(self.hist), len(other.hist))
        hist = [a + b for a, b in zip(self.hist + [0] * (width - len(self.hist)),
                                      other.hist + [0] * (width - len(other.hist)))]
        return ReplayTally(self.accepted + other.accepted, self.rounds + other.rounds, hist)

    def as_tensor(self, block_size: int, device) -> torch.Tensor:
        hist = self.hist + [0] * (block_size - len(self.hist))
        return torch.tensor([self.accepted, self.rounds, *hist], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> "ReplayTally":
        values = [int(round(v)) for v in tensor.tolist()]
        return cls(values[0], values[1], values[2:])


def supervised_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of every maximal run of supervised positions: each answer of a chat."""
    spans, start = [], None
    for position, supervised in enumerate([*loss_mask, 0]):
        if supervised and start is None:
            start = position
        elif not supervised and start is not None:
            spans.append((start, position))
            start = None
    return spans


def replay_rounds(streaks: list[int], spans: list[tuple[int, int]]) -> list[int]:
    """Tokens each round keeps, answer by answer. streaks[a]: drafted tokens the block at anchor a gets right
    (its labels stop at the answer's end, so streak <= end - 1 - a). The answer's first token is the prefill's,
    as in decoding: rounds cover the rest; a round's bonus token past the answer's end is not kept."""
    kept = []
    for start, end in spans:
        anchor = start
        while anchor < end - 1:
            streak = streaks[anchor]
            kept.append(min(streak + 1, end - 1 - anchor))
            anchor += streak + 1
    return kept


@dataclass
class AnchorPass:
    """One no-grad drafter pass over every anchor of some sequences: the accepted streak of the block at each
    anchor ([n, S], -1 where no anchor is) and, when asked for, each slot's best tokens as DDTree builds its tree
    from them (log-probabilities and ids [n, S, B-1, top], best first; trainer/training/tree_replay.py)."""

    streaks: torch.Tensor
    top_logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    # a DFlash2 drafter's trees grow from its selector (draft_tree.best_first_paired): its candidates [n, S, B-1, K],
    # their log-probs after the anchor [n, S, K] and after each candidate of the slot before [n, S, B-2, K, K]
    candidates: torch.Tensor | None = None
    first_logprobs: torch.Tensor | None = None
    pair_logprobs: torch.Tensor | None = None


def anchor_pass(drafter, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                width: int, top: int = 0) -> AnchorPass:
    """The streaks at every anchor (a supervised position followed by one): the block's guesses are its drafted
    chain (DFlash2: the selector's path); and the `top` best tokens of every slot when top > 0 (DFlash2: of its
    unary distributions, not the selector's). Anchors go `width` per sequence per forward, the last group
    padded, so the shapes of the forwards repeat; logits are reduced chunk by chunk and never held whole."""
    block_size = drafter.config.block_size
    n, seq_len = input_ids.shape
    device = input_ids.device
    valid = torch.zeros_like(loss_mask, dtype=torch.bool)
    valid[:, :-1] = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()
    counts = valid.sum(dim=1)
    most = int(counts.max()) if n else 0
    streaks = torch.full((n, seq_len), -1, dtype=torch.long, device=device)
    top = min(top, drafter.lm_head.weight.shape[0])
    result = AnchorPass(streaks)
    paired = bool(top and getattr(drafter, "selector_top_k", None))
    if paired:
        k = min(drafter.selector_top_k, drafter.lm_head.weight.shape[0])
        result.candidates = torch.zeros(n, seq_len, block_size - 1, k, dtype=torch.int32, device=device)
        result.first_logprobs = torch.zeros(n, seq_len, k, device=device)
        result.pair_logprobs = torch.zeros(n, seq_len, block_size - 2, k, k, device=device)
    elif top:
        result.top_logprobs = torch.zeros(n, seq_len, block_size - 1, top, device=device)
        result.top_ids = torch.zeros(n, seq_len, block_size - 1, top, dtype=torch.int32, device=device)
    if most == 0:
        return result
    # every sequence's anchor positions, in order, padded with -1 to the longest list
    order = torch.where(valid, torch.arange(seq_len, device=valid.device), seq_len).sort(dim=1).values
    positions = order[:, :most].masked_fill(order[:, :most] == seq_len, -1)
    for first in range(0, most, width):
        anchors = torch.full((n, width), -1, dtype=torch.long, device=device)
        group = positions[:, first:first + width]
        anchors[:, :group.shape[1]] = group
        anchor_tokens = input_ids.gather(1, anchors.clamp(min=0))
        hidden = drafter(features, anchor_tokens, anchors)
        labels = block_labels(input_ids, loss_mask, anchors, block_size)
        guesses, best = _reduce_chunks(drafter, hidden, anchor_tokens, top, paired=paired)
        found = accepted_streak(guesses.view(labels.shape) == labels, labels)
        real = anchors >= 0
        rows = torch.arange(n, device=device)[:, None].expand_as(anchors)
        streaks[rows[real], anchors[real]] = found[real].long()
        if paired:
            candidates, first_lp, pair_lp = (part.view(*anchors.shape, *part.shape[1:]) for part in best)
            result.candidates[rows[real], anchors[real]] = candidates[real].int()
            result.first_logprobs[rows[real], anchors[real]] = first_lp[real]
            result.pair_logprobs[rows[real], anchors[real]] = pair_lp[real]
        elif best is not None:
            values, ids = (part.view(*labels.shape, top) for part in best)
            result.top_logprobs[rows[real], anchors[real]] = values[real]
            result.top_ids[rows[real], anchors[real]] = ids[real].int()
    return result


def anchor_streaks(drafter, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                   width: int) -> torch.Tensor:
    """[n, S] int: the accepted streak of the drafter's block at every anchor, -1 elsewhere."""
    return anchor_pass(drafter, features, input_ids, loss_mask, width=width).streaks


def _reduce_chunks(drafter, hidden: torch.Tensor, anchor_tokens: torch.Tensor, top: int, *, paired: bool = False
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """For blocks of final hidden states [n, A, B, H] and their anchor tokens [n, A]: the drafted chain of each
    block (DFlash: each slot's argmax; DFlash2: the selector's path) and, for top > 0, each drafted slot's `top`
    best log-probabilities (float32, as the eval's tree proposer takes them) with their ids, or with `paired` the
    selector's candidates and log-probs per block (drafter.candidate_logprobs); a few blocks' logits at a time."""
    weight = drafter.lm_head.weight
    hidden, anchor_tokens = hidden.flatten(0, 1), anchor_tokens.flatten()
    blocks = max(1, LOGITS_PER_CHUNK // (weight.shape[0] * (hidden.shape[1] - 1)))
    guesses, values, ids = [], [], []
    for i in range(0, hidden.shape[0], blocks):
        drafted = hidden[i:i + blocks, 1:]
        logits = drafted.to(weight.dtype) @ weight.t()
        guesses.append(drafter.chain_from_logits(logits, drafted, anchor_tokens[i:i + blocks]).flatten())
        if paired:
            values.append(drafter.candidate_logprobs(logits.float(), drafted, anchor_tokens[i:i + blocks]))
        elif top:
            best = torch.log_softmax(logits.float(), dim=-1).topk(top, dim=-1)
            values.append(best.values.flatten(0, 1))
            ids.append(best.indices.flatten(0, 1))
    if paired:
        return torch.cat(guesses), tuple(torch.cat(parts) for parts in zip(*values))
    return torch.cat(guesses), ((torch.cat(values), torch.cat(ids)) if top else None)


def chain_tally(streaks: torch.Tensor, loss_mask: torch.Tensor, block_size: int) -> ReplayTally:
    """The replayed chain rounds of every sequence and the acceptance histogram, from its anchors' streaks."""
    hist = torch.bincount(streaks[streaks >= 0].flatten(), minlength=block_size)
    tally = ReplayTally(hist=hist.tolist()[:block_size])
    for row_streaks, row_mask in zip(streaks.tolist(), loss_mask.tolist()):
        kept = replay_rounds(row_streaks, supervised_spans(row_mask))
        tally = tally.add(ReplayTally(sum(kept), len(kept)))
    return tally


@torch.no_grad()
def replay_batch(drafter, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                 max_sequences: int, width: int) -> ReplayTally:
    """The replayed rounds and the acceptance histogram of the batch's first `max_sequences` sequences."""
    from trainer.model.drafter import unwrap

    inner = unwrap(drafter)
    count = min(max_sequences, input_ids.shape[0])
    if count <= 0:
        return ReplayTally(hist=[0] * inner.config.block_size)
    ids, mask = input_ids[:count], loss_mask[:count]
    streaks = anchor_streaks(inner, features[:count], ids, mask, width=max(1, width))
    return chain_tally(streaks, mask, inner.config.block_size)
