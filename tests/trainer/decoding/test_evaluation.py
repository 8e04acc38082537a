"""`trainer eval` on tiny targets: many prompts decoded at once over one KV cache give exactly the one-at-a-time
greedy output; trees verified in one forward with the ancestor-only mask accept exactly the drafted path the
target agrees with (an oracle drafter hides it behind wrong siblings); the report's tau, per-position acceptance
and kept tokens agree; in bf16 a near-tie divergence is a precision note (exit 0) and a clear one a failure
(exit 1); hybrid targets decode in batches too (a composite image-text checkpoint here; the rewinding of their
linear-attention states is tested in test_batched_hybrid.py) and refuse trees in one line."""
from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.conftest import run_trainer, write_prompts
from tests.trainer.test_train import write_untrained_drafter
from trainer.__main__ import main as trainer_main
from trainer.decoding.batched import RoundInput, chain_proposer, decode_batch, greedy_proposer
from trainer.decoding.draft_tree import DraftTree
from trainer.decoding.eval_report import rounding_epsilon, rounding_tolerance
from trainer.decoding.speculative import LayerTaps, greedy_decode
from trainer.model.drafter_files import load_drafter

BLOCK = 8


@pytest.fixture(scope="module")
def tiny(tiny_target, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data.generate import read_prompts
    from trainer.decoding.evaluation import _tokenize

    root = tmp_path_factory.mktemp("eval")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target))
    prompt_file = write_prompts(root / "prompts.jsonl", 6, seed=5)
    drafter_dir = write_untrained_drafter(tiny_target, root / "drafter", layers=1, block_size=BLOCK)
    drafter = load_drafter(drafter_dir, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings()).eval()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainer's subprocess tests: deterministic, and polite to a shared machine
    yield {"model": model, "drafter": drafter, "drafter_dir": drafter_dir, "taps": taps, "target": tiny_target,
           "prompt_file": prompt_file, "prompts": _tokenize(tokenizer, read_prompts(prompt_file))}
    taps.remove()
    torch.set_num_threads(threads)


def _greedy_one_by_one(tiny, max_new_tokens: int, eos_ids=frozenset()) -> list[list[int]]:
    return [greedy_decode(tiny["model"], ids, max_new_tokens=max_new_tokens, eos_ids=set(eos_ids)).tokens
            for ids in tiny["prompts"]]


def test_batched_greedy_and_chain_equal_greedy_one_prompt_at_a_time(tiny):
    assert len({len(ids) for ids in tiny["prompts"]}) > 1  # left padding is exercised
    reference = _greedy_one_by_one(tiny, 29)
    greedy = decode_batch(tiny["model"], tiny["taps"], tiny["prompts"], greedy_proposer(), max_new_tokens=29,
                          eos_ids=set(), extra_positions=0, record_top=True)
    assert [out.tokens for out in greedy.outputs] == reference
    for out in greedy.outputs:  # one token per round; the recorded best logits chose each token
        assert out.accepted_per_round == [1] * 28 and [ids[0] for _, ids in out.top] == out.tokens
    spec = decode_batch(tiny["model"], tiny["taps"], tiny["prompts"], chain_proposer(tiny["drafter"]),
                        max_new_tokens=29, eos_ids=set(), extra_positions=BLOCK)
    assert [out.tokens for out in spec.outputs] == reference
    # tau counts kept tokens: the rounds add up to every new token but the prefill's, none past the cut
    assert all(sum(out.accepted_per_round) == 28 for out in spec.outputs)


def test_batched_decoding_stops_after_an_end_token(tiny):
    free = _greedy_one_by_one(tiny, 30)
    stop = free[0][11]
    reference = _greedy_one_by_one(tiny, 30, eos_ids={stop})
    assert reference[0] == free[0][:free[0].index(stop) + 1]
    spec = decode_batch(tiny["model"], tiny["taps"], tiny["prompts"], chain_proposer(tiny["drafter"]),
                        max_new_tokens=30, eos_ids={stop}, extra_positions=BLOCK)
    assert [out.tokens for out in spec.outputs] == reference
    assert all(sum(out.accepted_per_round) == len(out.tokens) - 1 for out in spec.outputs)


def _oracle(reference: list[list[int]], prompts: list[list[int]], *, depth: int, known: int, vocab: int):
    """A proposer that knows greedy's answer: at each depth a wrong token, then (as the second child) the right
    one for the first `known` depths, another wrong one below."""
    def propose(round_input: RoundInput) -> list[DraftTree]:
        trees = []
        for prompt, anchor, position in zip(round_input.prompts, round_input.anchors.tolist(),
                                            round_input.positions.tolist()):
            answer = reference[prompt]
            start = position - len(prompts[prompt]) + 1  # index in the answer of the token after the anchor
            tokens, parents, parent = [anchor], [-1], 0
            for d in range(depth):
                right = answer[start + d] if start + d < len(answer) else 0
                if d >= known:
                    right = (right + 2) % vocab
                tokens += [(right + 1) % vocab, right]
                parents += [parent, parent]
                parent = len(tokens) - 1
            trees.append(DraftTree(tokens=tokens, parents=parents))
        return trees
    return propose


@pytest.mark.parametrize("depth, known", [(5, 5), (6, 2)])
def test_a_tree_verified_in_one_forward_accepts_exactly_the_path_greedy_takes(tiny, depth, known):
    """Every node sees only its ancestors: the wrong first child before the right one must not disturb it (a
    leak would change the target's choices and the output), and each round keeps the known path plus the bonus."""
    max_new = 37
    reference = _greedy_one_by_one(tiny, max_new)
    propose = _oracle(reference, tiny["prompts"], depth=depth, known=known,
                      vocab=tiny["model"].config.vocab_size)
    run = decode_batch(tiny["model"], tiny["taps"], tiny["prompts"], propose, max_new_tokens=max_new,
                       eos_ids=set(), extra_positions=depth)
    assert [out.tokens for out in run.outputs] == reference
    per_round, left = known + 1, max_new - 1
    expected = [per_round] * (left // per_round) + ([left % per_round] if left % per_round else [])
    for out in run.outputs:
        assert out.accepted_per_round == expected
        assert out.rejected_rounds == (len(expected) if known < depth else 0)


def test_eval_reports_drafter_baseline_and_trees_consistently(tiny):
    result = run_trainer("eval", "--target", tiny["target"], "--drafter", tiny["drafter_dir"], "--prompts",
                         tiny["prompt_file"], "--max-new-tokens", "37", "--tree-budget", "4,16", "--tree-budget", "40",
                         "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    runs = [report, report["baseline"], *report["trees"]]
    assert [tree["budget"] for tree in report["trees"]] == [4, 16, 40] and report["ok"]
    assert report["dtype"] == "float32" and report["batch_size"] == 6 and not report["failures"]
    for run in runs:
        assert run["identical_to_greedy"] and run["new_tokens"] == 6 * 37, run
        assert round(run["tau"] * run["rounds"]) == run["new_tokens"] - 6  # kept tokens only, the cut included
        assert len(run["acceptance"]) == BLOCK - 1
        assert sum(run["acceptance"]) == pytest.approx(run["tau"] - 1)


def test_eval_prints_a_table_of_every_run(tiny, capsys):
    code = trainer_main(["eval", "--target", str(tiny["target"]), "--drafter", str(tiny["drafter_dir"]),
                         "--prompts", str(tiny["prompt_file"]), "--max-new-tokens", "16", "--tree-budget", "8",
                         "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("Prompts: 6, up to 16 new tokens each; target in float32 on cpu")
    for name in ("greedy", "drafter", "baseline", "drafter tree 8"):
        assert any(line.startswith(name + " ") for line in lines), name
    assert "Per-position acceptance" in out and lines[-1] == "Output identical to greedy decoding: yes"


def _plant_verify_flips(monkeypatch, *, near_ties: bool) -> None:
    """The target as loaded for eval, its verify passes (a block of BLOCK tokens) rounding the root's two best
    logits the other way: only at near-ties (what bf16 does), or only where the margin is clear (a real bug)."""
    import trainer.decoding.evaluation as evaluation

    load = evaluation.load_target_for_generation

    def flipping_load(*args, **kwargs):
        model, tokenizer = load(*args, **kwargs)

        def flip(module, inputs, output):
            if output.shape[1] != BLOCK:
                return None
            output = output.clone()
            best = output[:, 0].float().topk(2, dim=-1)
            for row in range(output.shape[0]):
                (first, second), (a, b) = best.values[row].tolist(), best.indices[row].tolist()
                # well inside (or well outside) the bound: the report judges by greedy's one-token logits, which
                # on a GPU differ a little from this verify pass's
                tolerance = rounding_tolerance(rounding_epsilon(model.dtype), first)
                if (first - second <= tolerance / 4) if near_ties else (first - second > 4 * tolerance):
                    output[row, 0, a], output[row, 0, b] = second, first
            return output

        model.get_output_embeddings().register_forward_hook(flip)
        return model, tokenizer

    monkeypatch.setattr(evaluation, "load_target_for_generation", flipping_load)


@pytest.mark.parametrize("near_ties", [True, False])
def test_bf16_near_ties_are_notes_and_clear_divergences_fail(tiny, monkeypatch, capsys, near_ties):
    _plant_verify_flips(monkeypatch, near_ties=near_ties)
    code = trainer_main(["eval", "--target", str(tiny["target"]), "--drafter", str(tiny["drafter_dir"]),
                         "--prompts", str(tiny["prompt_file"]), "--max-new-tokens", "24", "--dtype", "bfloat16",
                         "--no-baseline", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "bfloat16" and report["baseline"] is None
    if near_ties:
        assert code == 0 and report["ok"] and not report["failures"], report["failures"]
        assert report["precision_notes"] and not report["identical_to_greedy"]
        assert all(note["margin"] <= note["tolerance"] for note in report["precision_notes"])
    else:
        assert code == 1 and not report["ok"]
        assert report["failures"] and all(f["margin"] is None or f["margin"] > f["tolerance"]
                                          for f in report["failures"])
        assert {f["prompt"] for f in report["failures"]} <= set(report["mismatched_prompts"])


def test_a_hybrid_target_decodes_in_batches_and_refuses_trees(tiny, tmp_path, capsys):
    from trainer.decoding.evaluation import evaluate
    from trainer.model.tiny_target import write_tiny_target

    target = write_tiny_target(tmp_path / "hybrid", family="qwen3.5", composite=True)
    drafter = write_untrained_drafter(target, tmp_path / "drafter", layers=1, block_size=4)
    prompts = write_prompts(tmp_path / "p.jsonl", 3, seed=2)
    report = evaluate(target=target, drafter_dir=drafter, prompts=prompts, max_new_tokens=12, device="cpu",
                      say=lambda line: None)
    assert report.batch_size == 3 and report.ok
    assert report.drafter.identical_to_greedy and report.baseline.identical_to_greedy
    assert report.baseline.rejected_rounds > 0  # the recurrent state was rolled back, exactly
    capsys.readouterr()
    code = trainer_main(["eval", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                         "--tree-budget", "8"])
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr[-2000:]
    assert "cannot be verified in one target forward" in errors[0] and "Traceback" not in stderr


def test_the_eval_benchmark_times_the_command_and_the_old_loop():
    import re
    import subprocess
    import sys

    from tests.trainer.conftest import REPO_ROOT, trainer_env

    # with a drafter trained first, as a real `trainer train` (the path the GPU figure of bench/RESULTS.md takes)
    done = subprocess.run([sys.executable, "bench/bench_eval.py", "--prompts", "3", "--max-new-tokens", "6",
                           "--tree-budget", "4", "--train-steps", "1", "--device", "cpu"], capture_output=True,
                          text=True, timeout=300, env=trainer_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    new = re.search(r"^new: trainer eval \(greedy, chain, baseline, trees\): ([\d.]+)s wall for 3 prompts x 6",
                    done.stdout, re.MULTILINE)
    old = re.search(r"^old: one prompt at a time \(greedy, chain\): ([\d.]+)s", done.stdout, re.MULTILINE)
    assert new and old and float(new.group(1)) > 0 and float(old.group(1)) > 0, done.stdout
    assert "tree 4: tau" in done.stdout and "failures 0," in done.stdout and "load average:" in done.stdout
    assert "Finished: 1 steps" in done.stderr, done.stderr[-3000:]
