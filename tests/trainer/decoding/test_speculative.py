"""Speculative decoding returns exactly the target's greedy output (checked against transformers' own greedy
generate), stops at end-of-sequence tokens, and counts the tokens each verification accepted."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.test_train import write_untrained_drafter
from trainer.decoding.speculative import LayerTaps, greedy_decode, speculative_decode
from trainer.model.drafter_files import load_drafter


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def target_and_drafter(tiny_target, tmp_path_factory, request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target))
    drafter_dir = write_untrained_drafter(tiny_target, tmp_path_factory.mktemp("drafter"), layers=1, block_size=4,
                                          architecture=request.param)
    drafter = load_drafter(drafter_dir, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings()).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hello, what is 1 + 2?"}],
                                           add_generation_prompt=True, tokenize=False)
    return model, drafter, tokenizer(prompt, add_special_tokens=False)["input_ids"]


def test_greedy_decode_matches_transformers_generate(target_and_drafter):
    model, _, prompt = target_and_drafter
    ours = greedy_decode(model, prompt, max_new_tokens=40, eos_ids=set())
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert ours.tokens == theirs[0, len(prompt):].tolist()


def test_speculative_output_equals_greedy(target_and_drafter):
    model, drafter, prompt = target_and_drafter
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    try:
        greedy = greedy_decode(model, prompt, max_new_tokens=37, eos_ids=set())
        spec = speculative_decode(model, drafter, taps, prompt, max_new_tokens=37, eos_ids=set())
    finally:
        taps.remove()
    assert spec.tokens == greedy.tokens and len(spec.tokens) == 37
    assert all(1 <= n <= drafter.config.block_size for n in spec.accepted_per_round)
    # the rounds count exactly the tokens kept after the first (the prefill's): none past max_new_tokens
    assert sum(spec.accepted_per_round) == len(spec.tokens) - 1


def test_decoding_stops_after_an_end_of_sequence_token(target_and_drafter):
    model, drafter, prompt = target_and_drafter
    free = greedy_decode(model, prompt, max_new_tokens=30, eos_ids=set()).tokens
    stop = free[12]
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    try:
        spec = speculative_decode(model, drafter, taps, prompt, max_new_tokens=30, eos_ids={stop})
    finally:
        taps.remove()
    greedy = greedy_decode(model, prompt, max_new_tokens=30, eos_ids={stop})
    assert spec.tokens == greedy.tokens == free[:free.index(stop) + 1]
