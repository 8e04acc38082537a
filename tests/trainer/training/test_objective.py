"""Anchors, labels, weights, the chunked loss and the metrics."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.training.objective import (
    IGNORE, block_labels, chunked_weighted_ce, decay_weights, dflash_step, sample_anchors)


def test_anchors_need_two_supervised_positions_and_are_sorted_and_deterministic():
    loss_mask = torch.zeros(2, 40, dtype=torch.long)
    loss_mask[0, 10:30] = 1
    loss_mask[0, 33] = 1            # isolated: position 33 has no supervised successor
    loss_mask[1, 5:9] = 1
    a = sample_anchors(loss_mask, 8, torch.Generator().manual_seed(1))
    b = sample_anchors(loss_mask, 8, torch.Generator().manual_seed(1))
    c = sample_anchors(loss_mask, 8, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, 8)
    row0 = a[0].tolist()
    assert row0 == sorted(row0) and len(set(row0)) == 8 and all(10 <= x <= 28 for x in row0)
    assert a[1].tolist() == [5, 6, 7, -1, -1, -1, -1, -1]


def test_anchor_draws_cover_every_valid_position_over_many_steps():
    loss_mask = torch.ones(1, 12, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        seen.update(sample_anchors(loss_mask, 3, generator)[0].tolist())
    assert seen == set(range(11))


def test_labels_are_the_tokens_after_the_anchor():
    input_ids = torch.arange(100, 120).unsqueeze(0)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, 14] = 0
    anchors = torch.tensor([[2, 12, 17, -1]])
    labels = block_labels(input_ids, loss_mask, anchors, block_size=4)
    assert labels[0, 0].tolist() == [103, 104, 105]
    assert labels[0, 1].tolist() == [113, IGNORE, 115]        # loss_mask 0 at position 14
    assert labels[0, 2].tolist() == [118, 119, IGNORE]        # past the sequence
    assert labels[0, 3].tolist() == [IGNORE] * 3              # padded block


def test_decay_weights():
    w = decay_weights(16, 7.0)
    assert w.shape == (15,)
    for k in range(1, 16):
        assert math.isclose(w[k - 1].item(), math.exp(-(k - 1) / 7.0), rel_tol=1e-6)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_chunked_loss_and_gradient_equal_the_unchunked_ones(chunk_rows):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(37, 16, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 37, (50,), generator=generator)
    weights = torch.rand(50, generator=generator, dtype=torch.float64)
    reference = (F.cross_entropy(hidden @ weight.t(), labels, reduction="none") * weights).sum() / weights.sum()
    (ref_grad,) = torch.autograd.grad(reference, hidden)
    loss, correct, _, _ = chunked_weighted_ce(hidden, weight, labels, weights, chunk_rows=chunk_rows)
    (grad,) = torch.autograd.grad(loss * 3.0, hidden)
    torch.testing.assert_close(loss.double(), reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad * 3.0, rtol=1e-5, atol=1e-6)
    assert torch.equal(correct, (hidden @ weight.t()).argmax(-1) == labels)


def test_chunked_loss_with_a_bf16_head_matches_fp32_math():
    """As on a GPU: fp32 hidden states, a bf16 LM head; the softmax is taken in fp32, the products in bf16."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(40, 32, generator=generator, requires_grad=True)
    weight = torch.randn(300, 32, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 300, (40,), generator=generator)
    weights = torch.rand(40, generator=generator) * (torch.arange(40) % 5 != 0)   # some rows unsupervised
    head = weight.float()
    reference = (F.cross_entropy(hidden.detach().bfloat16().float() @ head.t(), labels, reduction="none")
                 * weights).sum() / weights.sum()
    probe = hidden.detach().bfloat16().float().requires_grad_(True)
    (ref_grad,) = torch.autograd.grad((F.cross_entropy(probe @ head.t(), labels, reduction="none") * weights).sum()
                                      / weights.sum(), probe)
    loss = chunked_weighted_ce(hidden, weight, labels, weights, chunk_rows=16).loss
    (grad,) = torch.autograd.grad(loss, hidden)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=2e-2, atol=2e-2)
    assert (grad - ref_grad).norm() / ref_grad.norm() < 1e-2   # bf16 products: about 2^-8 per element
    assert torch.all(grad[torch.arange(40) % 5 == 0] == 0)   # weight 0: exactly no gradient


def test_chunked_loss_never_builds_the_full_logits(monkeypatch):
    import trainer.training.objective as objective

    shapes = []
    real_log_softmax = torch.log_softmax
    monkeypatch.setattr(objective.torch, "log_softmax",
                        lambda x, **kw: (shapes.append(tuple(x.shape)), real_log_softmax(x, **kw))[1])
    hidden = torch.randn(100, 8, requires_grad=True)
    chunked_weighted_ce(hidden, torch.randn(30, 8), torch.zeros(100, dtype=torch.long), torch.ones(100),
                        chunk_rows=16)
    assert shapes and max(s[0] for s in shapes) == 16 and sum(s[0] for s in shapes) == 100


def _oracle_forward(drafter, input_ids, shift):
    """A stand-in forward whose slot k hidden state makes lm_head pick input_ids[anchor + k + shift]."""
    def forward(features, anchor_tokens, anchors, **_):
        k = torch.arange(drafter.config.block_size, device=anchors.device)
        positions = (anchors.clamp(min=0)[..., None] + k + shift).clamp(0, input_ids.shape[1] - 1)
        tokens = input_ids.gather(1, positions.flatten(1)).view_as(positions)
        return drafter.lm_head.weight[tokens] * 50.0
    return forward


def _identity_head_drafter(target, block_size):
    """A drafter whose LM head is identity-like (row t scores highest against itself), vocabulary 32."""
    from torch import nn

    lm_head = nn.Linear(target.hidden_size, 32, bias=False).to(target.device)
    with torch.no_grad():
        lm_head.weight.copy_(torch.eye(32, target.hidden_size))
    drafter = make_drafter(target, block_size=block_size)
    drafter.__dict__["lm_head"] = lm_head
    return drafter


def _fix_anchors(monkeypatch, anchors):
    import trainer.training.objective as objective

    monkeypatch.setattr(objective, "sample_anchors",
                        lambda loss_mask, num_anchors, generator: anchors.to(loss_mask.device))


@pytest.mark.parametrize("shift", [0, 1, -1])
def test_labels_are_not_off_by_one(tiny_target, monkeypatch, shift):
    block = 6
    drafter = _identity_head_drafter(tiny_target, block)
    input_ids = random_ids(tiny_target, (2, 40), seed=3) % 32
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :5] = 0
    _fix_anchors(monkeypatch, torch.tensor([[5, 11, 30], [8, 20, -1]]))
    drafter.forward = _oracle_forward(drafter, input_ids, shift)
    out = dflash_step(drafter, torch.zeros(2, 40, 1, device=tiny_target.device), input_ids, loss_mask,
                      num_anchors=3, block_size=block, gamma=4.0, noise=0.0,
                      generator=torch.Generator().manual_seed(0))
    assert (out.n_blocks, out.n_supervised) == (5, 5 * (block - 1))
    if shift == 0:
        assert out.acc == 1.0 and out.streak == block - 1 and out.loss.item() < 1e-3
    else:
        assert out.acc < 0.2 and out.streak < 0.5


def test_streak_is_the_accepted_prefix_length(tiny_target, monkeypatch):
    drafter = _identity_head_drafter(tiny_target, 6)
    input_ids = torch.arange(40, device=tiny_target.device).unsqueeze(0)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, 26] = 0         # the block at 24: slots 1 right, slot 2 unsupervised -> streak 1
    _fix_anchors(monkeypatch, torch.tensor([[3, 10, 24]]))
    oracle = _oracle_forward(drafter, input_ids, 0)

    def wrong_at_slot_3(*args, **kwargs):
        hidden = oracle(*args, **kwargs).clone()
        hidden[0, 0, 3] = drafter.lm_head.weight[0] * 50.0     # block at 3: slot 3 wrong -> streak 2
        return hidden
    drafter.forward = wrong_at_slot_3
    out = dflash_step(drafter, torch.zeros(1, 40, 1, device=tiny_target.device), input_ids, loss_mask,
                      num_anchors=3, block_size=6, gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(0))
    assert out.n_supervised == 14
    assert out.streak.item() == pytest.approx((2 + 5 + 1) / 3)
    assert out.acc.item() == pytest.approx(13 / 14)


def test_noise_is_applied_only_in_training_and_is_deterministic(tiny_target):
    drafter = make_drafter(tiny_target, block_size=4)
    input_ids = random_ids(tiny_target, (1, 30), seed=4)
    features = tiny_target.features(input_ids)
    loss_mask = torch.ones_like(input_ids)

    def loss(noise, seed=0):
        return dflash_step(drafter, features, input_ids, loss_mask, num_anchors=6, block_size=4, gamma=4.0,
                           noise=noise, generator=torch.Generator().manual_seed(seed)).loss.item()

    drafter.train()
    assert loss(0.5) == loss(0.5) != loss(0.0)
    drafter.eval()
    assert loss(0.5) == loss(0.0)


def test_a_few_adamw_steps_lower_the_loss(tiny_target):
    drafter = make_drafter(tiny_target, block_size=4).train()
    input_ids = random_ids(tiny_target, (2, 48), seed=5)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :8] = 0
    features = tiny_target.features(input_ids)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(25):
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=40, block_size=4, gamma=4.0,
                          noise=0.0, generator=generator)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in drafter.parameters())
    assert tiny_target.lm_head.weight.grad is None and tiny_target.embed_tokens.weight.grad is None
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_step_through_a_wrapper_equals_the_bare_drafter(tiny_target):
    class Wrapper(torch.nn.Module):       # what DDP looks like from outside: .module and a forwarding call
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    drafter = make_drafter(tiny_target, block_size=4)
    input_ids = random_ids(tiny_target, (1, 30), seed=9)
    features = tiny_target.features(input_ids)
    loss_mask = torch.ones_like(input_ids)

    def loss(model):
        return dflash_step(model, features, input_ids, loss_mask, num_anchors=5, block_size=4, gamma=4.0,
                           noise=0.1, generator=torch.Generator().manual_seed(0)).loss
    assert torch.equal(loss(Wrapper(drafter)), loss(drafter))
    with pytest.raises(ValueError):
        dflash_step(drafter, features, input_ids, loss_mask, num_anchors=5, block_size=8, gamma=4.0,
                    noise=0.0, generator=torch.Generator())
