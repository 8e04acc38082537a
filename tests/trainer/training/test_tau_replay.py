"""The replayed rounds on a text equal real speculative decoding of the same text, round for round, when the text
is the target's own greedy output (float32, the CPU); the pieces of the replay on hand-made streaks."""
from __future__ import annotations

import pytest
import torch

from trainer.decoding.speculative import LayerTaps, greedy_decode, speculative_decode
from trainer.training.tau_replay import ReplayTally, anchor_streaks, replay_batch, replay_rounds, supervised_spans


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def self_text_and_drafter(tiny_target, request):
    """The tiny target's greedy answers to three prompts, and a drafter trained a little on them: good enough
    to accept long runs in some rounds and nothing in others, which is what the replay must get right. A DFlash2
    drafter's rounds follow its selector's path."""
    from tests.trainer.tiny_models import TINY_DFLASH2
    from trainer.planning.dflash2 import Dflash2Sizes
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.target import TargetModel
    from trainer.training.objective import dflash_step
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target))
    target = TargetModel(model, layer_ids=[1, 3], mask_token_id=tokenizer.mask_token_id, tokenizer=tokenizer)
    texts = []
    for question in ("Hello, what is 1 + 2?", "bada lume sorn tika", "It is 3! user system"):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer = greedy_decode(model, prompt_ids, max_new_tokens=40, eos_ids=set()).tokens
        texts.append((prompt_ids, answer))
    width = max(len(p) + len(a) for p, a in texts)
    input_ids = torch.zeros(len(texts), width, dtype=torch.long)
    loss_mask = torch.zeros_like(input_ids)
    for row, (prompt_ids, answer) in enumerate(texts):
        input_ids[row, :len(prompt_ids) + len(answer)] = torch.tensor(prompt_ids + answer)
        loss_mask[row, len(prompt_ids):len(prompt_ids) + len(answer)] = 1
    config = DrafterConfig.from_target(model.config, num_layers=1, block_size=6, target_layer_ids=[1, 3],
                                       mask_token_id=tokenizer.mask_token_id,
                                       dflash2=Dflash2Sizes(**TINY_DFLASH2) if request.param == "dflash2" else None)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    features = target.features(input_ids)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=64, block_size=6, gamma=4.0,
                          noise=0.0, generator=generator)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    drafter.eval()
    return model, target, drafter.requires_grad_(False), texts, input_ids, loss_mask, features


def test_replayed_rounds_equal_real_speculative_decoding(self_text_and_drafter):
    model, target, drafter, texts, input_ids, loss_mask, features = self_text_and_drafter
    streaks = anchor_streaks(drafter, features, input_ids, loss_mask, width=7).tolist()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    replayed_all, decoded_all = [], []
    try:
        for row, (prompt_ids, answer) in enumerate(texts):
            decoded = speculative_decode(model, drafter, taps, prompt_ids, max_new_tokens=len(answer), eos_ids=set())
            assert decoded.tokens == answer  # the text is what decoding produces: the replay's premise
            replayed = replay_rounds(streaks[row], supervised_spans(loss_mask[row].tolist()))
            assert replayed == decoded.accepted_per_round, row
            replayed_all += replayed
            decoded_all += decoded.accepted_per_round
    finally:
        taps.remove()
    # the drafter is neither useless nor perfect: rounds of one token and rounds of several both occur
    assert 1 in decoded_all and max(decoded_all) >= 3, decoded_all
    tally = replay_batch(drafter, features, input_ids, loss_mask, max_sequences=len(texts), width=16)
    assert (tally.accepted, tally.rounds) == (sum(decoded_all), len(decoded_all))
    assert tally.tau == sum(decoded_all) / len(decoded_all)
    # the histogram counts every anchor once: supervised positions followed by another
    assert sum(tally.hist) == sum(len(answer) - 1 for _, answer in texts) and len(tally.hist) == 6
    mean_streak = sum(k * n for k, n in enumerate(tally.hist)) / sum(tally.hist)
    assert tally.tau < mean_streak + 1  # what the old figure overstated


def test_replay_walks_rounds_from_each_answer_start():
    #          positions:  0   1  2  3  4  5  6  7  8  9
    streaks = [-1, 2, 0, 0, 1, 0, -1, 5, 0, -1]
    mask = [0, 1, 1, 1, 1, 1, 0, 1, 1, 1]
    assert supervised_spans(mask) == [(1, 6), (7, 10)]
    # answer 1: anchor 1 keeps 3 (2 drafted + bonus) -> anchor 4 keeps 1 of 2 (the bonus is past the end)
    # answer 2: anchor 7 keeps 2 (its streak is the whole rest, no bonus)
    assert replay_rounds(streaks, supervised_spans(mask)) == [3, 1, 2]


def test_tallies_add_and_survive_the_all_reduce_tensor():
    one, two = ReplayTally(10, 4, [3, 1]), ReplayTally(5, 5, [4, 0, 2])
    total = one.add(two)
    assert (total.accepted, total.rounds, total.hist) == (15, 9, [7, 1, 2])
    assert total.tau == 15 / 9 and total.shares() == [0.7, 0.1, 0.2]
    assert ReplayTally.from_tensor(total.as_tensor(4, "cpu")) == ReplayTally(15, 9, [7, 1, 2, 0])
    assert ReplayTally().tau is None and ReplayTally().shares() == []


def test_a_dflash2_drafters_streaks_follow_its_selector_not_the_top1(self_text_and_drafter):
    """The replay above agrees with decoding; here, that the streaks it walks are the selector path's, which on
    this text accept differently from each slot's top-1 at some anchors."""
    from trainer.training.objective import accepted_streak, block_labels

    model, target, drafter, texts, input_ids, loss_mask, features = self_text_and_drafter
    if drafter.config.dflash2 is None:
        pytest.skip("DFlash has no selector")
    anchors = torch.arange(input_ids.shape[1] - 1)[None].expand(input_ids.shape[0], -1)
    labels = block_labels(input_ids, loss_mask, anchors, drafter.config.block_size)
    hidden = drafter(features, input_ids.gather(1, anchors), anchors).flatten(0, 1)
    top1 = drafter.lm_head(hidden[:, 1:]).argmax(dim=-1).view(labels.shape)
    chain = drafter.chain(hidden, input_ids.gather(1, anchors).flatten()).view(labels.shape)
    valid = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()
    by_chain = accepted_streak(chain == labels, labels)[valid]
    assert not torch.equal(by_chain, accepted_streak(top1 == labels, labels)[valid])
    streaks = anchor_streaks(drafter, features, input_ids, loss_mask, width=7)
    assert torch.equal(streaks[:, :-1][valid], by_chain)
