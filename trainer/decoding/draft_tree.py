"""Draft trees for one verification forward: a chain (DFlash's block), or a DDTree built best-first from the
per-slot distributions of one block.

The drafter predicts every slot of a block in one pass, so slot d has one distribution whatever came before it:
a path root -> t1 -> ... -> td scores prod_d q_d(t_d). Best-first search pops the highest-scoring node not yet
in the tree and pushes its two successors (the next-ranked sibling at its depth, its best child one slot deeper);
since a path's score only falls along it, the first N pops are exactly the N best nodes, and they form a tree.

Node 0 is the root: the anchor token, already accepted. Verifying a tree feeds every node at position
anchor + depth with an ancestor-only mask, so each node sees exactly its own path, as it would in a chain.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: list[int]  # node tokens; node 0 is the anchor
    parents: list[int]  # parent of each node; -1 for the root; a parent always comes before its children

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        return tree_layout(torch.tensor([self.parents]))[0][0].tolist()

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n, n]: row i is True at i and at every ancestor of i (what node i may attend to)."""
        return tree_layout(torch.tensor([self.parents]))[1][0]

    def accept(self, target_next: list[int]) -> tuple[list[int], int]:
        """Walk from the root while the target's greedy token (target_next[node], its choice after that node's
        path) is a child; the nodes of the accepted path (root excluded) and the target's bonus token."""
        children: dict[tuple[int, int], int] = {}
        for node, (parent, token) in enumerate(zip(self.parents, self.tokens)):
            if parent >= 0:
                children.setdefault((parent, token), node)
        path, node = [], 0
        while (node, target_next[node]) in children:
            node = children[(node, target_next[node])]
            path.append(node)
        return path, target_next[node]


def tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For trees of equal size, parents [T, n] (-1 at the root): depths [T, n] and ancestor-or-self masks
    [T, n, n]. One step per node for all trees at once: a node sees what its parent sees, and itself."""
    count, size = parents.shape
    rows = torch.arange(count, device=parents.device)
    depths = torch.zeros(count, size, dtype=torch.long, device=parents.device)
    masks = torch.eye(size, dtype=torch.bool, device=parents.device).repeat(count, 1, 1)
    for node in range(1, size):
        parent = parents[:, node]
        depths[:, node] = depths[rows, parent] + 1
        masks[:, node] |= masks[rows, parent]
    return depths, masks


def chain(anchor: int, drafts: list[int]) -> DraftTree:
    """DFlash's block: each draft the child of the one before."""
    return DraftTree(tokens=[anchor, *drafts], parents=list(range(-1, len(drafts))))


def best_first(anchor: int, logprobs: list[list[float]], ids: list[list[int]], budget: int) -> DraftTree:
    """The root and the `budget` most likely nodes, from each slot's top tokens: logprobs[d-1] and ids[d-1] hold
    depth d's candidates, best first (at least min(budget, V) of them)."""
    slots = len(logprobs)
    if budget < 1 or slots < 1:
        return chain(anchor, [])
    rank_limit = min(budget, len(logprobs[0]))
    tokens, parents = [anchor], [-1]
    # (-score, push order, depth, rank, parent node): heapq pops the highest score first, ties the oldest
    frontier = [(-logprobs[0][0], 0, 1, 0, 0)]
    pushed = 1
    while frontier and len(tokens) <= budget:
        negative, _, depth, rank, parent = heapq.heappop(frontier)
        node = len(tokens)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        if rank + 1 < rank_limit:
            sibling = negative + logprobs[depth - 1][rank] - logprobs[depth - 1][rank + 1]
            heapq.heappush(frontier, (sibling, pushed, depth, rank + 1, parent))
            pushed += 1
        if depth < slots:
            heapq.heappush(frontier, (negative - logprobs[depth][0], pushed, depth + 1, 0, node))
            pushed += 1
    return DraftTree(tokens=tokens, parents=parents)


def best_first_paired(anchor: int, first: list[float], later: list[list[list[float]]], ids: list[list[int]],
                      budget: int) -> DraftTree:
    """The root and the `budget` most likely nodes when a slot's distribution depends on the token before it
    (DFlash2's selector): ids[d][i] is candidate i of depth d + 1, first[i] its log-prob after the anchor and
    later[d][i][j] the log-prob of candidate j of depth d + 2 after candidate i of depth d + 1. A path's score
    still only falls along it, so best-first search keeps exactly the best nodes; a node's children are ranked
    after its own candidate."""
    slots = len(ids)
    if budget < 1 or slots < 1:
        return chain(anchor, [])

    def ranked(scores: list[float]) -> list[tuple[float, int]]:
        return sorted(((score, i) for i, score in enumerate(scores)), key=lambda pair: -pair[0])

    tokens, parents = [anchor], [-1]
    # (-score, push order, depth, the parent's node and score, the parent's ranked children, rank among them)
    root_children = ranked(first)
    frontier = [(-root_children[0][0], 0, 1, 0, 0.0, root_children, 0)]
    pushed = 1
    while frontier and len(tokens) <= budget:
        negative, _, depth, parent, parent_score, siblings, rank = heapq.heappop(frontier)
        candidate = siblings[rank][1]
        node = len(tokens)
        tokens.append(ids[depth - 1][candidate])
        parents.append(parent)
        if rank + 1 < len(siblings):
            heapq.heappush(frontier, (-(parent_score + siblings[rank + 1][0]), pushed, depth, parent, parent_score,
                                      siblings, rank + 1))
            pushed += 1
        if depth < slots:
            children = ranked(later[depth - 1][candidate])
            heapq.heappush(frontier, (negative - children[0][0], pushed, depth + 1, node, -negative, children, 0))
            pushed += 1
    return DraftTree(tokens=tokens, parents=parents)
