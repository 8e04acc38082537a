"""τ of DDTree verification predicted from text: tree rounds replayed teacher-forced, as tau_replay.py replays
chains.

A round at anchor a builds the tree `trainer eval --tree-budget N` would build there (the same best-first
builder, trainer/decoding/draft_tree.py, from the same per-slot log-probabilities of one block), accepts the
longest tree path that matches the text's continuation plus the target's own next token (the bonus), and the
next round starts after it. On a text that is the target's own greedy output this is exactly the τ the eval
measures (tests/trainer/training/test_tree_replay.py); on other text it is the prediction.

The slot distributions of every anchor come from the chain replay's drafter pass (one pass serves both); trees
are built on the host only at the anchors the rounds visit, about one in τ, so a budget costs a few hundred
heap operations per round and no extra forward. A DFlash2 drafter's trees grow from its selector's candidates,
each child scored after its parent, as the eval's do (the pass keeps K x K log-probs per slot and anchor).
"""
from __future__ import annotations

import numpy as np

from trainer.decoding.draft_tree import best_first, best_first_paired
from trainer.training.objective import IGNORE
from trainer.training.tau_replay import AnchorPass, ReplayTally, replay_rounds, supervised_spans


class _TreeStreaks:
    """Drafted tokens the tree at anchor a gets accepted, computed when the rounds ask for anchor a. `paired`: a
    DFlash2 drafter's (candidates, first log-probs, pair log-probs) of the sequence's anchors, whose trees grow
    from its selector as the eval's do; else `logprobs` and `top_ids` hold each slot's best tokens."""

    def __init__(self, ids: list[int], mask: list[int], logprobs: np.ndarray | None, top_ids: np.ndarray | None,
                 budget: int, paired: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.ids, self.mask, self.logprobs, self.top_ids, self.budget = ids, mask, logprobs, top_ids, budget
        self.paired = paired

    def _tree(self, anchor: int):
        if self.paired is not None:
            candidates, first, pairs = self.paired
            return best_first_paired(self.ids[anchor], first[anchor].tolist(), pairs[anchor].tolist(),
                                     candidates[anchor].tolist(), self.budget)
        return best_first(self.ids[anchor], self.logprobs[anchor, :, :self.budget].tolist(),
                          self.top_ids[anchor, :, :self.budget].tolist(), self.budget)

    def __getitem__(self, anchor: int) -> int:
        slots = (self.logprobs if self.paired is None else self.paired[0]).shape[1]
        # slot k's label: the text's token at anchor + k where it is supervised (the chain's labels exactly)
        labels = [self.ids[p] if p < len(self.ids) and self.mask[p] else IGNORE
                  for p in range(anchor + 1, anchor + 1 + slots)] + [IGNORE]
        tree = self._tree(anchor)
        depths = [0] * len(tree)
        for node in range(1, len(tree)):
            depths[node] = depths[tree.parents[node]] + 1
        # the target's choice after a node's path, where that path is the text's own: its next token
        path, _ = tree.accept([labels[depth] for depth in depths])
        return len(path)


def replay_tree_rounds(ids: list[int], mask: list[int], logprobs: np.ndarray | None, top_ids: np.ndarray | None,
                       budget: int, paired: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> list[int]:
    """Tokens each tree round keeps on one sequence (logprobs, top_ids: [S, B-1, K >= budget] of its anchors; or
    a DFlash2 drafter's `paired` candidates and log-probs, AnchorPass's, of its anchors)."""
    return replay_rounds(_TreeStreaks(ids, mask, logprobs, top_ids, budget, paired), supervised_spans(mask))


def tree_tallies(found: AnchorPass, input_ids, loss_mask, budgets: list[int]) -> dict[int, ReplayTally]:
    """The replayed tree rounds of every sequence of a pass made with top >= max(budgets), per budget."""
    if not budgets:
        return {}
    paired = None
    if found.candidates is not None:
        paired = [part.cpu().numpy() for part in (found.candidates, found.first_logprobs, found.pair_logprobs)]
        logprobs = top_ids = [None] * len(input_ids)
    else:
        logprobs, top_ids = found.top_logprobs.cpu().numpy(), found.top_ids.cpu().numpy()
    tallies = {budget: ReplayTally() for budget in budgets}
    for row, (ids, mask) in enumerate(zip(input_ids.tolist(), loss_mask.int().tolist())):
        rows = None if paired is None else tuple(part[row] for part in paired)
        for budget in budgets:
            kept = replay_tree_rounds(ids, mask, logprobs[row], top_ids[row], budget, rows)
            tallies[budget] = tallies[budget].add(ReplayTally(sum(kept), len(kept)))
    return tallies
