"""Tree rounds replayed teacher-forced on a text equal `trainer eval --tree-budget` decoding of the same text, round
for round, when the text is the target's own greedy output (float32, the CPU); the replay on a hand-made block."""
from __future__ import annotations

import numpy as np
import pytest

from tests.trainer.training.test_tau_replay import self_text_and_drafter  # noqa: F401 (a fixture)
from trainer.decoding.batched import decode_batch, tree_proposer
from trainer.decoding.speculative import LayerTaps
from trainer.training.tau_replay import anchor_pass, chain_tally
from trainer.training.tree_replay import replay_tree_rounds, tree_tallies

BUDGETS = [2, 4, 8, 32]


def test_replayed_tree_rounds_equal_the_evals_tree_decoding(self_text_and_drafter):  # noqa: F811
    model, target, drafter, texts, input_ids, loss_mask, features = self_text_and_drafter
    found = anchor_pass(drafter, features, input_ids, loss_mask, width=7, top=max(BUDGETS))
    tallies = tree_tallies(found, input_ids, loss_mask, BUDGETS)
    prompts = [prompt_ids for prompt_ids, _ in texts]
    new_tokens = len(texts[0][1])
    assert all(len(answer) == new_tokens for _, answer in texts)
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    decoded_tau = {}
    try:
        for budget in BUDGETS:
            # what `trainer eval --tree-budget` runs for a target that batches (evaluation.py's _Runner.tree)
            run = decode_batch(model, taps, prompts, tree_proposer(drafter, budget), max_new_tokens=new_tokens,
                               eos_ids=set(), extra_positions=drafter.config.block_size)
            decoded_all = []
            for row, (out, (_, answer)) in enumerate(zip(run.outputs, texts)):
                assert out.tokens == answer  # the text is what decoding produces: the replay's premise
                if found.candidates is None:
                    replayed = replay_tree_rounds(input_ids[row].tolist(), loss_mask[row].tolist(),
                                                  found.top_logprobs[row].numpy(), found.top_ids[row].numpy(), budget)
                else:   # DFlash2: trees from the selector's candidates, as the eval's tree proposer builds them
                    paired = tuple(part[row].numpy() for part in (found.candidates, found.first_logprobs,
                                                                  found.pair_logprobs))
                    replayed = replay_tree_rounds(input_ids[row].tolist(), loss_mask[row].tolist(), None, None,
                                                  budget, paired)
                assert replayed == out.accepted_per_round, (budget, row)
                decoded_all += out.accepted_per_round
            assert (tallies[budget].accepted, tallies[budget].rounds) == (sum(decoded_all), len(decoded_all))
            decoded_tau[budget] = tallies[budget].tau
    finally:
        taps.remove()
    chain = chain_tally(found.streaks, loss_mask, drafter.config.block_size).tau
    # second choices are worth something to this drafter: a larger tree accepts more than a smaller one and
    # than the chain, so the figures differ and the equality above compares something
    assert chain < decoded_tau[32] and decoded_tau[2] < decoded_tau[32], (chain, decoded_tau)
    # no budgets (eval_tree_budgets: []): the pass keeps no candidates and there is nothing to replay
    plain = anchor_pass(drafter, features, input_ids, loss_mask, width=7)
    assert plain.top_logprobs is None and tree_tallies(plain, input_ids, loss_mask, []) == {}
    assert plain.streaks.equal(found.streaks)  # keeping the candidates leaves the chain's streaks as they were


def test_a_tree_round_keeps_the_longest_matching_path_and_the_bonus():
    # text: prompt token 5, then the answer 1 2 3 4 (supervised); B = 4, so three slots, vocabulary of five
    ids, mask = [5, 1, 2, 3, 4], [0, 1, 1, 1, 1]
    logprobs = np.full((5, 3, 2), -9.0, dtype=np.float32)
    top = np.zeros((5, 3, 2), dtype=np.int32)
    # at anchor 1 each slot's best token is wrong and its second right: a chain gets nothing; best first, a tree
    # takes the chain 0 0 0 (scores -0.1, -0.2, -0.3) before the right first token 2 (-0.5)
    logprobs[1] = [[-0.1, -0.5], [-0.1, -0.6], [-0.1, -0.7]]
    top[1] = [[0, 2], [0, 3], [0, 4]]
    # anchor 2 (after one token) knows the rest: its best tokens are 3, 4 (then past the answer's end)
    logprobs[2] = [[-0.1, -3.0], [-0.1, -3.0], [-0.1, -3.0]]
    top[2] = [[3, 0], [4, 0], [1, 0]]
    assert replay_tree_rounds(ids, mask, logprobs, top, budget=1) == [1, 2]  # no match, bonus; 3 4 then the end
    assert replay_tree_rounds(ids, mask, logprobs, top, budget=3) == [1, 2]
    # budget 4 holds 2 at depth 1 (no child of it): the round keeps 2 and the bonus 3; anchor 3 keeps 4 alone
    assert replay_tree_rounds(ids, mask, logprobs, top, budget=4) == [2, 1]
