"""The training objectives of trainer/training/losses.py on hand-made distributions (tv is 1 - alpha, cap is the
expected accepted prefix, kl with a one-hot p is CE, D-PACE's weights are the paper's), their gradients, their
chunked form against the unchunked one, and `loss:` end to end through `trainer train`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import run_trainer, write_config
from trainer.training.losses import (LAMBDA_RATE, Normalisers, Objective, acceptance_rate, chunk_terms,
                                     chunked_objective, dpace_weights, expected_accepted_prefix, forward_kl, row_stats)

ALL = ("ce", "cap", "kl", "tv", "nla", "lk_hybrid")


def log(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).log()


def test_tv_is_one_minus_the_overlap_and_falls_as_q_meets_p() -> None:
    p, q = log([[0.5, 0.3, 0.2]]), log([[0.2, 0.2, 0.6]])
    alpha = acceptance_rate(p, q)
    assert alpha.item() == pytest.approx(0.2 + 0.2 + 0.2)
    norms = Normalisers(slots=torch.tensor(1.0), blocks=torch.tensor(1.0))
    q_param = q.clone().requires_grad_()
    tv = Objective({"tv": 1.0}, "decay")
    terms = chunk_terms(row_stats(q_param, p, torch.tensor([0]), tv), torch.tensor([True]), torch.tensor([1.0]), tv,
                        1, norms)
    assert terms["tv"].item() == pytest.approx(1 - 0.6)
    terms["tv"].backward()
    # the only token where q < p is token 0 and 1: raising their log-probability lowers the loss
    assert q_param.grad[0, 0] < 0 and q_param.grad[0, 1] < 0 and q_param.grad[0, 2] == 0


def test_kl_against_a_one_hot_p_is_the_cross_entropy() -> None:
    q = torch.log_softmax(torch.randn(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), -1)
    labels = torch.tensor([1, 0, 6, 3])
    one_hot = torch.full_like(q, -1e4).scatter(1, labels[:, None], 0.0)   # log p: 1 at the label, ~0 elsewhere
    assert forward_kl(one_hot, q) == pytest.approx(-q.gather(1, labels[:, None]).squeeze(1))


def test_cap_is_the_expected_accepted_prefix_and_raising_q_y_lowers_the_loss() -> None:
    q_y = [[0.9, 0.5, 0.8, 0.1], [0.5, 0.5, 0.5, 0.5]]
    supervised = torch.tensor([[True, True, True, True], [True, True, False, True]])
    prefix = expected_accepted_prefix(log(q_y), supervised)
    assert prefix[0].item() == pytest.approx(0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.8 + 0.9 * 0.5 * 0.8 * 0.1)
    assert prefix[1].item() == pytest.approx(0.5 + 0.25)  # the unsupervised third slot ends the prefix
    # a confident block: cap's cold-start CE share exp(-3 * mean q) is small, and raising any q(y) lowers cap
    logits = torch.tensor([[4.0, 0.0, 0.0], [3.0, 0.0, 0.0], [5.0, 0.0, 0.0]], requires_grad=True)
    norms = Normalisers(slots=torch.tensor(3.0), blocks=torch.tensor(1.0))
    cap = Objective({"cap": 1.0}, "decay")
    terms = chunk_terms(row_stats(torch.log_softmax(logits, -1), None, torch.tensor([0, 0, 0]), cap),
                        torch.ones(3, dtype=torch.bool), torch.ones(3), cap, 3, norms)
    q = torch.softmax(logits.detach(), -1)[:, 0]
    lam = math.exp(-3 * q.mean().item())
    ce = -q.log().mean().item()
    expected = (1 - lam) * (1 - (q[0] + q[0] * q[1] + q[0] * q[1] * q[2]).item() / 3) + lam * ce
    assert terms["cap"].item() == pytest.approx(expected, rel=1e-5)
    terms["cap"].backward()
    assert (logits.grad[:, 0] < 0).all()


def test_dpace_weights_are_the_papers_reverse_sums_of_smoothed_confidence_products() -> None:
    q_y = [[0.8, 0.6, 0.4]]
    weights = dpace_weights(log(q_y), torch.tensor([[True, True, True]]), alpha=0.5)
    c = [0.5 * q + 0.5 for q in q_y[0]]                       # (1 - alpha) q + alpha
    reach = [c[0], c[0] * c[1], c[0] * c[1] * c[2]]
    assert weights[0].tolist() == pytest.approx([sum(reach), reach[1] + reach[2], reach[2]])
    masked = dpace_weights(log(q_y), torch.tensor([[True, False, True]]), alpha=0.5)
    # an unsupervised slot weighs 0 and passes the confidence on unchanged
    assert masked[0].tolist() == pytest.approx([c[0] + c[0] * c[2], 0.0, c[0] * c[2]])


def batch(rows: int, vocab: int, hidden: int, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, hidden, generator=g), torch.randn(vocab, hidden, generator=g),
            torch.randn(rows, hidden, generator=g), torch.randint(0, vocab, (rows,), generator=g),
            torch.rand(rows, generator=g) > 0.2)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("slot_weights", ["decay", "dpace"])
def test_chunked_and_unchunked_agree_and_only_the_drafter_gets_a_gradient(name, slot_weights) -> None:
    slots = 4
    hidden, head, target, labels, supervised = batch(6 * slots, 32, 8)
    head.requires_grad_()
    decay = torch.exp(-torch.arange(slots, dtype=torch.float32) / 3).repeat(6)
    objective = Objective({name: 1.0}, slot_weights)
    results = []
    for chunk_blocks in (1, 4, 6):
        leaf = hidden.clone().requires_grad_()
        loss, _, terms, _ = chunked_objective(leaf, head.detach(), labels, supervised, decay, objective, slots=slots,
                                           target_hidden=target, chunk_blocks=chunk_blocks)
        loss.backward()
        results.append((loss.item(), leaf.grad))
        assert terms[name].item() == pytest.approx(loss.item())
    assert leaf.grad.abs().sum() > 0
    for loss, grad in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-5)
        assert torch.allclose(grad, results[0][1], atol=1e-6)
    # the frozen LM head and the target's states are inputs, not parameters: no gradient reaches them
    assert head.grad is None


def reference_objective(hidden, head, target, labels, supervised, decay, objective, slots):
    """The objectives as written before the one-pass chunk loop: whole [rows, vocab] log-softmaxes of the drafter
    and of the target, every term by autograd through them (one chunk)."""
    log_q = torch.log_softmax(hidden @ head.t(), -1)
    log_p = torch.log_softmax(target @ head.t(), -1)
    log_q_y = log_q.gather(1, labels[:, None]).squeeze(1) * supervised
    by_block = (-1, slots)
    if objective.slot_weights == "dpace":
        weight = dpace_weights(log_q_y.detach().view(by_block), supervised.view(by_block), 0.5).flatten()
        norm = supervised.sum().float()
    else:
        weight = decay * supervised
        norm = weight.sum()
    alpha = acceptance_rate(log_p, log_q)
    kl = forward_kl(log_p, log_q)
    lam = torch.exp(-LAMBDA_RATE * alpha).detach()
    per_slot = {"ce": -log_q_y, "kl": kl, "tv": 1 - alpha, "nla": -torch.log(alpha),
                "lk_hybrid": lam * kl + (1 - lam) * (1 - alpha)}
    return sum(w * (weight * per_slot[name]).sum() / norm for name, w in objective.weights.items())


@pytest.mark.parametrize("weights", [{"kl": 1.0}, {"lk_hybrid": 1.0}, {"ce": 0.3, "kl": 0.3, "tv": 0.2, "nla": 0.2}])
@pytest.mark.parametrize("slot_weights", ["decay", "dpace"])
def test_the_one_pass_chunks_give_the_whole_softmax_values_and_gradients(weights, slot_weights) -> None:
    """kl and lk_hybrid take p from the drafter's own product and log-softmax (the target's rows stacked under
    it) and compose the logits' gradient in closed form: the values and gradients of the whole-softmax autograd
    reference (fp32 log-probabilities in both) to float rounding, with several chunks."""
    slots = 3
    hidden, head, target, labels, supervised = batch(5 * slots, 40, 6, seed=7)
    target = 0.7 * hidden + 0.3 * target        # p near q: alpha well inside (0, 1), ties absent
    decay = torch.exp(-torch.arange(slots, dtype=torch.float32) / 2).repeat(5)
    objective = Objective(weights, slot_weights, dpace_alpha=0.5)
    ours, theirs = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    out = chunked_objective(ours, head, labels, supervised, decay, objective, slots=slots, target_hidden=target,
                            chunk_blocks=2)
    out.loss.backward()
    expected = reference_objective(theirs, head, target, labels, supervised, decay, objective, slots)
    expected.backward()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)


def test_generic_ce_with_decay_weights_equals_the_fast_path() -> None:
    from trainer.training.objective import chunked_weighted_ce

    slots = 5
    hidden, head, _, labels, supervised = batch(4 * slots, 16, 8, seed=3)
    decay = torch.exp(-torch.arange(slots, dtype=torch.float32) / 4).repeat(4)
    fast = hidden.clone().requires_grad_()
    fast_loss = chunked_weighted_ce(fast, head, labels, decay * supervised, chunk_rows=3).loss
    fast_loss.backward()
    generic = hidden.clone().requires_grad_()
    loss = chunked_objective(generic, head, labels, supervised, decay, Objective({"ce": 0.5, "tv": 0.0}, "decay"),
                             slots=slots, target_hidden=hidden, chunk_blocks=2).loss
    (2 * loss).backward()
    assert (2 * loss).item() == pytest.approx(fast_loss.item(), rel=1e-5)
    assert torch.allclose(generic.grad, fast.grad, atol=1e-6)


def test_a_drafter_step_against_the_target_distribution_trains_the_drafter_only(tiny_target) -> None:
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.target import TargetModel
    from trainer.training.objective import dflash_step

    target = TargetModel.load(tiny_target, layer_ids=None, num_taps=1)
    drafter = DFlashDrafter(DrafterConfig.from_target(target.config, num_layers=1, block_size=4,
                                                      target_layer_ids=target.layer_ids,
                                                      mask_token_id=target.mask_token_id),
                            embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    input_ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    features, final = target.features(input_ids, final=True)
    logits = target.logits(input_ids)
    assert torch.allclose(target.lm_head(final), logits, atol=1e-4)   # the extra layers are the target's own
    out = dflash_step(drafter, features, input_ids, torch.ones_like(input_ids), num_anchors=4, block_size=4,
                      gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(1),
                      objective=Objective({"kl": 0.5, "cap": 0.5}, "decay"), target_hidden=final)
    out.loss.backward()
    assert set(out.terms) == {"kl", "cap"}
    assert out.loss.item() == pytest.approx(0.5 * out.terms["kl"].item() + 0.5 * out.terms["cap"].item(), rel=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters() if p.requires_grad)
    assert all(p.grad is None for p in target.hf_model.parameters())


def test_training_with_a_weighted_objective_logs_each_term(base_config, tmp_path) -> None:
    config = {**base_config, "max_steps": 3, "loss": {"ce": 0.5, "kl": 0.5}}
    result = run_trainer("train", "--config", write_config(tmp_path / "mixed.yaml", **config), timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "loss: 0.5*ce + 0.5*kl, dpace slot weights" in result.stdout   # the default slot weights
    records = [json.loads(line) for line in (Path(config["output_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("event") == "step"]
    assert steps and all({"loss_ce", "loss_kl"} <= r.keys() for r in steps)
    for record in steps:
        assert record["loss"] == pytest.approx(0.5 * record["loss_ce"] + 0.5 * record["loss_kl"], rel=1e-4)
    # the checkpoint records what it was trained for (the model card of `trainer export` reads it there)
    recorded = json.loads((Path(config["output_dir"]) / "step_3" / "trainer_config.json").read_text())
    assert recorded["loss"] == {"ce": 0.5, "kl": 0.5} and recorded["slot_weights"] == "dpace"


@pytest.mark.parametrize("loss, message", [
    ("cross_entropy", "loss: unknown objective 'cross_entropy'"),
    ({"ce": 0.5, "kl": -1}, "loss: the weight of 'kl' must be a number >= 0, got -1"),
])
def test_a_bad_objective_is_one_line_and_exit_2(base_config, tmp_path, loss, message, capsys) -> None:
    from trainer.__main__ import main

    path = write_config(tmp_path / "bad.yaml", **{**base_config, "loss": loss})
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def test_the_memory_plan_assumes_the_chunks_the_losses_take() -> None:
    from trainer.planning import memory_plan
    from trainer.training import losses, objective

    assert memory_plan.ROW_VOCAB_PER_CHUNK == losses.ROW_VOCAB_PER_CHUNK
    assert memory_plan.LOGITS_PER_CHUNK == objective.LOGITS_PER_CHUNK


def test_a_chunks_math_eager_off_the_whole_chunk_shape_and_its_functions_compose_the_gradient() -> None:
    """chunk_math on the CPU: eager whatever is asked; its figures and gradient are the log-softmax's, by autograd
    through a whole [rows, vocab] reference (the compiled path on a GPU is held to this eager one below)."""
    from trainer.training import chunk_math

    g = torch.Generator().manual_seed(11)
    rows, vocab = 6, 50
    z = torch.randn(2 * rows, vocab, generator=g)
    labels = torch.randint(0, vocab, (rows,), generator=g)
    assert chunk_math.DEFAULT._choose(chunk_math.figures, labels, rows) is chunk_math.figures
    found = chunk_math.DEFAULT.figures(z, labels, True, True, whole_rows=rows)
    leaf = z[:rows].clone().requires_grad_()
    log_q, log_p = torch.log_softmax(leaf, -1), torch.log_softmax(z[rows:], -1)
    y, k, a = torch.rand(3, rows, generator=g)
    reference = (y * log_q.gather(1, labels[:, None]).squeeze(1) + k * forward_kl(log_p, log_q)
                 + a * acceptance_rate(log_p, log_q)).sum()
    reference.backward()
    torch.testing.assert_close(found.kl, forward_kl(log_p, log_q).detach())
    torch.testing.assert_close(found.alpha, acceptance_rate(log_p, log_q).detach())
    assert torch.equal(found.argmax, z[:rows].argmax(-1))
    grad = chunk_math.logit_gradient(z, found.lse, labels, y, k, a, found.shared_sum)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("weights, slot_weights", [({"ce": 1.0}, "dpace"), ({"kl": 1.0}, "dpace"),
                                                   ({"lk_hybrid": 1.0}, "dpace"), ({"ce": 0.5, "tv": 0.5}, "decay")])
def test_the_compiled_chunks_give_the_eager_ones_loss_and_gradient_on_the_gpu(weights, slot_weights) -> None:
    """Whole chunks compiled, the last one eager, against every chunk eager, in bf16 as a step runs them."""
    from trainer.training.chunk_math import ChunkMath

    slots, blocks, vocab = 7, 40, 32000
    g = torch.Generator(device="cuda").manual_seed(5)
    hidden = torch.randn(blocks * slots, 256, device="cuda", generator=g).bfloat16()
    target = (0.8 * hidden.float() + 0.6 * torch.randn_like(hidden.float())).bfloat16()
    head = (torch.randn(vocab, 256, device="cuda", generator=g) * 0.05).bfloat16()
    labels = torch.randint(0, vocab, (blocks * slots,), device="cuda", generator=g)
    supervised = torch.rand(blocks * slots, device="cuda", generator=g) > 0.1
    decay = torch.exp(-torch.arange(slots, device="cuda", dtype=torch.float32) / 7).repeat(blocks)
    objective = Objective(weights, slot_weights)
    results = []
    for math in (ChunkMath(compiled=True), ChunkMath(compiled=False)):
        leaf = hidden.clone().requires_grad_()
        out = chunked_objective(leaf, head, labels, supervised, decay, objective, slots=slots,
                                target_hidden=target, chunk_blocks=16, math=math)   # chunks of 16, 16, 8 blocks
        out.loss.backward()
        results.append((out.loss.float(), leaf.grad.float(), out.correct))
    (loss, grad, correct), (eager_loss, eager_grad, eager_correct) = results
    torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-5)
    assert float((grad - eager_grad).norm() / eager_grad.norm()) < 1e-2
    assert float((correct != eager_correct).float().mean()) < 0.01   # bf16 ties may break either way


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("weights", [{"ce": 1.0}, {"lk_hybrid": 1.0}])
def test_the_start_up_compiles_every_whole_chunk_a_step_runs(weights) -> None:
    """compile_loss_chunks at start-up: a step of several whole chunks and a last partial one compiles nothing."""
    from types import SimpleNamespace

    from trainer.training.compile_warmup import compile_loss_chunks
    from trainer.training.losses import whole_chunk_blocks
    from trainer.training.metrics import compiled_graphs

    slots, vocab, hidden_size = 7, 151936, 256
    head = (torch.randn(vocab, hidden_size, device="cuda") * 0.05).bfloat16()
    objective = Objective(weights, "dpace")
    drafter = SimpleNamespace(lm_head=SimpleNamespace(weight=head), config=SimpleNamespace(block_size=slots + 1))
    lines: list[str] = []
    assert compile_loss_chunks(drafter, objective, say=lines.append) and len(lines) == 2
    before = compiled_graphs()
    rows = int(2.5 * whole_chunk_blocks(vocab, slots)) * slots
    hidden = torch.randn(rows, hidden_size, device="cuda").bfloat16().requires_grad_()
    labels = torch.randint(0, vocab, (rows,), device="cuda")
    ones = torch.ones(rows, device="cuda")
    out = chunked_objective(hidden, head, labels, ones.bool(), ones, objective, slots=slots,
                            target_hidden=hidden.detach() * 0.9)
    out.loss.backward()
    torch.cuda.synchronize()
    assert compiled_graphs() == before, lines
