"""DDTree pieces without a model: best-first trees hold exactly the most likely nodes, the verify mask lets a node
see exactly its ancestors, acceptance walks the longest path the target agrees with; per-position acceptance
adds up to tau - 1; a divergence from greedy is a precision note only at a near-tie in low precision."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from trainer.decoding.draft_tree import DraftTree, best_first, chain, tree_layout
from trainer.decoding.eval_report import Divergence, acceptance, divergence, rounding_epsilon, rounding_tolerance
from trainer.decoding.speculative import Decoded


def _slot_candidates(rng: random.Random, slots: int, vocab: int) -> tuple[list[list[float]], list[list[int]]]:
    logprobs, ids = [], []
    for _ in range(slots):
        weights = [rng.random() ** 3 + 1e-3 for _ in range(vocab)]
        total = sum(weights)
        ranked = sorted(((math.log(w / total), token) for token, w in enumerate(weights)), reverse=True)
        logprobs.append([lp for lp, _ in ranked])
        ids.append([token for _, token in ranked])
    return logprobs, ids


def _path(tree: DraftTree, node: int) -> tuple[int, ...]:
    tokens = []
    while node > 0:
        tokens.append(tree.tokens[node])
        node = tree.parents[node]
    return tuple(reversed(tokens))


@pytest.mark.parametrize("seed", range(4))
def test_best_first_keeps_exactly_the_most_likely_nodes(seed):
    rng = random.Random(seed)
    slots, vocab = 3, 5
    logprobs, ids = _slot_candidates(rng, slots, vocab)
    score_of = [{token: lp for lp, token in zip(logprobs[d], ids[d])} for d in range(slots)]
    # every node of the full tree is a path of 1..slots tokens; its score is the sum of its slots' log-probs
    every = sorted((sum(score_of[d][t] for d, t in enumerate(path)), path)
                   for depth in range(1, slots + 1) for path in itertools.product(range(vocab), repeat=depth))
    every.reverse()
    for budget in (1, 2, 5, 9, 20, 40):
        tree = best_first(7, logprobs, ids, budget)
        assert len(tree) == budget + 1 and tree.tokens[0] == 7 and tree.parents[0] == -1
        assert all(0 <= parent < node for node, parent in enumerate(tree.parents) if node)
        paths = {_path(tree, node) for node in range(1, len(tree))}
        assert len(paths) == budget  # no node twice
        assert paths == {path for _, path in every[:budget]}, budget


def test_layout_lets_each_node_see_exactly_its_ancestors():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    tree = DraftTree(tokens=[9, 1, 2, 3, 4, 5, 6], parents=[-1, 0, 0, 1, 1, 2, 3])
    assert tree.depths() == [0, 1, 1, 2, 2, 2, 3]
    lineage = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}, 6: {0, 1, 3, 6}}
    mask = tree.ancestor_mask()
    for node, seen in lineage.items():
        assert set(torch.nonzero(mask[node]).flatten().tolist()) == seen, node
    # a chain's mask is causal; trees of one size are laid out together
    depths, masks = tree_layout(torch.tensor([chain(9, [1, 2, 3]).parents, [-1, 0, 0, 1]]))
    assert torch.equal(masks[0], torch.ones(4, 4, dtype=torch.bool).tril())
    assert depths.tolist() == [[0, 1, 2, 3], [0, 1, 1, 2]]


def test_accept_takes_the_longest_path_the_target_agrees_with():
    tree = DraftTree(tokens=[9, 10, 11, 12, 13, 14, 15], parents=[-1, 0, 0, 1, 1, 2, 3])
    # target_next[node]: the target's greedy token after that node's path
    assert tree.accept([11, 0, 14, 0, 0, 0, 0]) == ([2, 5], 0)  # the second branch, then the bonus after node 5
    assert tree.accept([10, 12, 0, 15, 0, 0, 8]) == ([1, 3, 6], 8)  # all the way down, bonus after the leaf
    assert tree.accept([99, 0, 0, 0, 0, 0, 0]) == ([], 99)  # nothing drafted matches: the target's token alone
    drafts = chain(5, [6, 7, 8])
    assert drafts.accept([6, 7, 1, 2]) == ([1, 2], 1)


def test_per_position_acceptance_adds_up_to_tau_minus_one():
    rounds = [1, 4, 8, 2, 1, 3]  # tokens kept per round (drafts + bonus), block size 8
    shares = acceptance(rounds, 8)
    assert len(shares) == 7 and shares[0] == pytest.approx(4 / 6) and shares[6] == pytest.approx(1 / 6)
    assert shares == sorted(shares, reverse=True)
    assert sum(shares) == pytest.approx(sum(rounds) / len(rounds) - 1)


def _greedy(tokens: list[int], top: list[tuple[list[float], list[int]]]) -> Decoded:
    return Decoded(tokens=tokens, seconds=0.0, top=top)


def test_a_divergence_is_a_precision_note_only_at_a_near_tie_in_low_precision():
    # greedy chose 5 at new token 1 over 6 by 0.01 (a near-tie) and over 7 by 3.0 (clear)
    greedy = _greedy([1, 5, 2], [([9.0, 1.0], [1, 4]), ([2.0, 1.99, -1.0], [5, 6, 7]), ([3.0, 0.0], [2, 3])])
    bf16, f32 = rounding_epsilon(torch.bfloat16), rounding_epsilon(torch.float32)
    assert divergence("drafter", 0, [1, 5, 2], greedy, bf16) is None
    note = divergence("drafter", 0, [1, 6, 8], greedy, bf16)
    assert (note.kind, note.position, note.greedy_token, note.token) == ("precision", 1, 5, 6)
    assert note.margin == pytest.approx(0.01) and note.tolerance == rounding_tolerance(bf16, 2.0)
    assert note.tolerance == pytest.approx(8 * 2 ** -7 * 2.0)
    clear = divergence("drafter", 0, [1, 7, 8], greedy, bf16)
    assert clear.kind == "failure" and clear.margin == pytest.approx(3.0) and "FAILURE" in clear.line()
    assert divergence("drafter", 0, [1, 99], greedy, bf16).margin is None  # not among greedy's best: failure
    assert divergence("drafter", 0, [1, 99], greedy, bf16).kind == "failure"
    exact = divergence("drafter", 0, [1, 6, 8], greedy, f32)  # float32 keeps the exact check
    assert f32 is None and exact.kind == "failure" and exact.tolerance is None
    assert divergence("drafter", 0, [1, 5], greedy, bf16).kind == "failure"  # stopped early: no near-tie
    # float32 with fla's TF32 dots: 0.01 is within 8 TF32 epsilons of 2.0 (0.0156), 3.0 is not
    tf32 = rounding_epsilon(torch.float32, tf32_dots=True)
    assert tf32 == 2 ** -10 and divergence("drafter", 0, [1, 6, 8], greedy, tf32).kind == "precision"
    assert divergence("drafter", 0, [1, 7, 8], greedy, tf32).kind == "failure"
    assert rounding_epsilon(torch.bfloat16, tf32_dots=True) == rounding_epsilon(torch.bfloat16)
    assert isinstance(note, Divergence) and "precision note" in note.line()
