"""Hybrid targets (Gated DeltaNet + full attention, dense and MoE) decode many prompts at once: every verify pass
feeds each row its whole chain, and the linear-attention states are rewound row by row to what each row accepted
(trainer/decoding/linear_state_rollback.py). An oracle proposer that knows greedy's answer drafts k right tokens
then wrong ones, k drawn per row and round,
so rows keep different lengths in one round; the batched output must still be exactly
greedy's, one prompt at a time, and each round must keep k + 1 tokens. Beneath the tokens, a rewound row's states
must equal those of the row fed only its accepted tokens: on the CPU (transformers' torch path) and on a GPU
(flash-linear-attention's kernels where installed, which take float32 as TF32)."""
from __future__ import annotations

import random

import pytest
import torch

from tests.trainer.conftest import write_prompts
from tests.trainer.test_train import write_untrained_drafter
from trainer.decoding.batched import RoundInput, chain_proposer, decode_batch, greedy_proposer
from trainer.decoding.draft_tree import chain
from trainer.decoding.speculative import LayerTaps, greedy_decode

BLOCK = 6
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=["qwen3.5", "qwen3.5-moe"])
def hybrid(request, tmp_path_factory):
    from trainer.data.generate import load_target_for_generation, read_prompts
    from trainer.decoding.evaluation import _tokenize
    from trainer.model.drafter_files import load_drafter
    from trainer.model.tiny_target import write_tiny_target

    root = tmp_path_factory.mktemp("hybrid-batch")
    target = write_tiny_target(root / "target", family=request.param)
    model, tokenizer = load_target_for_generation(target, torch.device("cpu"), "float32")
    drafter_dir = write_untrained_drafter(target, root / "drafter", layers=1, block_size=BLOCK)
    drafter = load_drafter(drafter_dir, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings()).eval()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    prompts = _tokenize(tokenizer, read_prompts(write_prompts(root / "prompts.jsonl", 5, seed=3)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    reference = [greedy_decode(model, ids, max_new_tokens=NEW_TOKENS, eos_ids=set()).tokens for ids in prompts]
    yield {"model": model, "drafter": drafter, "taps": taps, "prompts": prompts, "reference": reference}
    taps.remove()
    torch.set_num_threads(threads)


def _oracle(hybrid, plan: dict, seed: int):
    """Drafts k of greedy's next tokens, then wrong ones; k (0..BLOCK-1) is drawn per row and round and kept in
    plan[(prompt, tokens decoded so far)]."""
    rng, vocab = random.Random(seed), hybrid["model"].config.vocab_size

    def propose(round_input: RoundInput):
        trees = []
        for prompt, anchor, position in zip(round_input.prompts, round_input.anchors.tolist(),
                                            round_input.positions.tolist()):
            done = position - len(hybrid["prompts"][prompt]) + 1
            truth = (hybrid["reference"][prompt][done:] + [0] * BLOCK)[:BLOCK - 1]
            k = plan[(prompt, done)] = rng.randint(0, BLOCK - 1)
            trees.append(chain(int(anchor), truth[:k] + [(t + 1) % vocab for t in truth[k:]]))
        return trees
    return propose


def test_batched_greedy_of_a_hybrid_equals_one_prompt_at_a_time(hybrid):
    assert len({len(ids) for ids in hybrid["prompts"]}) > 1  # left padding reaches the linear layers too
    greedy = decode_batch(hybrid["model"], hybrid["taps"], hybrid["prompts"], greedy_proposer(),
                          max_new_tokens=NEW_TOKENS, eos_ids=set(), extra_positions=0)
    assert [out.tokens for out in greedy.outputs] == hybrid["reference"]


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_keeping_different_lengths_are_each_rewound_exactly(hybrid, seed):
    plan: dict = {}
    run = decode_batch(hybrid["model"], hybrid["taps"], hybrid["prompts"], _oracle(hybrid, plan, seed),
                       max_new_tokens=NEW_TOKENS, eos_ids=set(), extra_positions=BLOCK)
    assert [out.tokens for out in run.outputs] == hybrid["reference"]
    for prompt, out in enumerate(run.outputs):
        done, expected = 1, []
        while done < NEW_TOKENS:
            expected.append(min(plan[(prompt, done)] + 1, NEW_TOKENS - done))
            done += expected[-1]
        assert out.accepted_per_round == expected
    kept = {k for k in plan.values()}
    assert 0 in kept and BLOCK - 1 in kept  # a round refused everything, another accepted the whole chain


def test_rows_that_finish_early_leave_the_batch_with_their_states(hybrid):
    stop = hybrid["reference"][0][9]
    reference = [greedy_decode(hybrid["model"], ids, max_new_tokens=NEW_TOKENS, eos_ids={stop}).tokens
                 for ids in hybrid["prompts"]]
    assert len({len(tokens) for tokens in reference}) > 1  # rows leave in different rounds
    run = decode_batch(hybrid["model"], hybrid["taps"], hybrid["prompts"], chain_proposer(hybrid["drafter"]),
                       max_new_tokens=NEW_TOKENS, eos_ids={stop}, extra_positions=BLOCK)
    assert [out.tokens for out in run.outputs] == reference


def test_the_hybrid_decoding_benchmark_runs_and_matches_in_float32():
    import re
    import subprocess
    import sys

    from tests.trainer.conftest import REPO_ROOT, trainer_env

    done = subprocess.run([sys.executable, "bench/bench_hybrid_decode.py", "--model", "tiny-hybrid", "--device", "cpu",
                           "--prompts", "4", "--old-prompts", "2", "--max-new-tokens", "8"], capture_output=True,
                          text=True, timeout=300, env=trainer_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("greedy", "chain"):
        line = re.search(rf"^{name}: 4 at once ([\d.]+) tok/s .* one at a time ([\d.]+) tok/s .*; identical (\d)/2$",
                         done.stdout, re.MULTILINE)
        assert line and float(line.group(1)) > 0 and float(line.group(2)) > 0, done.stdout
        assert line.group(3) == "2", done.stdout  # float32: batched and one at a time decode the same tokens


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3.5-moe"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU])])
def test_a_rewound_row_has_the_states_of_feeding_only_its_accepted_tokens(family, device, tmp_path):
    from transformers import DynamicCache

    from trainer.data.generate import load_target_for_generation
    from trainer.decoding.linear_state_rollback import LinearStates
    from trainer.decoding.speculative import cache_argument
    from trainer.model.tiny_target import write_tiny_target

    model, _ = load_target_for_generation(write_tiny_target(tmp_path / "t", family=family), torch.device(device),
                                          "float32")
    rng = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 300, (3, 21), generator=rng).to(device)
    drafts = torch.randint(10, 300, (3, BLOCK), generator=rng).to(device)
    lengths = torch.tensor([1, 4, BLOCK], device=device)  # refused at once, part way, the whole chain kept

    def states_after(rows: torch.Tensor, fed: torch.Tensor, keep=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache = DynamicCache(config=model.config)
        given = {cache_argument(model): cache}  # the keyword of this transformers release (5.17 on the GPU box)
        with torch.no_grad():
            model(input_ids=rows, use_cache=True, **given)
            linear = LinearStates(model, cache)
            with linear.verifying() as verified:
                model(input_ids=fed, use_cache=True, **given)
            if keep is not None:
                verified.rewind(keep)
        return [(cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0]) for i, _ in linear.layers]

    rewound = states_after(prompts, drafts, lengths)
    tolerance = 1e-5 if device == "cpu" else 2e-2
    for row, length in enumerate(lengths.tolist()):
        alone = states_after(prompts[row:row + 1], drafts[row:row + 1, :length])
        for (conv, recurrent), (conv_alone, recurrent_alone) in zip(rewound, alone):
            for state, state_alone in ((conv, conv_alone), (recurrent, recurrent_alone)):
                error = (state[row] - state_alone[0]).norm() / state_alone[0].norm()
                assert error < tolerance, (row, length, float(error))
