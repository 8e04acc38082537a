"""DFlash2: the block convolution stays inside its block, the selector's scores and path, the drafter's chain."""
from __future__ import annotations

import itertools

import pytest
import torch

from tests.trainer.test_model_support import (  # noqa: F401  (fixtures)
    TINY_DFLASH2, device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.model.modeling_dflash import BlockConv, CandidateSelector, viterbi_path


def _random_conv(seed: int = 0) -> BlockConv:
    torch.manual_seed(seed)
    conv = BlockConv(32, kernel_size=2, group_size=16, block_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    return conv


def test_conv_is_two_taps_over_the_same_block_by_hand():
    conv = _random_conv()
    y, normed = torch.randn(1, 8, 32), torch.randn(1, 8, 32)
    kernels = conv.kernels(normed)
    out = conv(y, kernels, 1)
    for q in range(8):
        block, slot = divmod(q, 4)
        k = kernels[0, block, slot, 1].repeat_interleave(16, dim=-1) + conv.base_kernel[1]   # [taps, H]
        expected = k[0] * y[0, q] + (k[1] * y[0, q - 1] if slot else 0)
        torch.testing.assert_close(out[0, q], expected)


def test_conv_never_reads_another_block_or_a_later_slot():
    conv = _random_conv()
    y, normed = torch.randn(2, 12, 32), torch.randn(2, 12, 32)
    base = conv(y, conv.kernels(normed), 0)
    for changed in range(12):
        y2, normed2 = y.clone(), normed.clone()
        y2[:, changed] += 1.0
        normed2[:, changed] += 1.0
        out = conv(y2, conv.kernels(normed2), 0)
        moved = (out - base).abs().amax(dim=(0, 2)) > 0
        block, slot = divmod(changed, 4)
        allowed = {changed, changed + 1} if slot < 3 else {changed}
        assert {q for q in range(12) if moved[q]} <= allowed, changed
        assert moved[changed]


def test_a_fresh_dflash2_drafter_computes_what_dflash_does(tiny_target):
    dflash = make_drafter(tiny_target, seed=3)
    dflash2 = make_drafter(tiny_target, seed=3, architecture="dflash2")
    dflash2.load_state_dict(dflash.state_dict(), strict=False)   # same backbone; the conv is the identity
    ids = random_ids(tiny_target, (1, 40))
    features = tiny_target.features(ids, torch.ones_like(ids))
    anchors = torch.tensor([[5, 17, 30]], device=ids.device)
    tokens = ids.gather(1, anchors)
    torch.testing.assert_close(dflash2(features, tokens, anchors), dflash(features, tokens, anchors))


def test_dflash2_drafter_blocks_do_not_see_each_other(tiny_target):
    drafter = make_drafter(tiny_target, architecture="dflash2")
    for conv in (m for m in drafter.modules() if isinstance(m, BlockConv)):
        with torch.no_grad():
            conv.base_kernel.normal_()
            conv.kernel_projection.weight.normal_(std=0.1)
    ids = random_ids(tiny_target, (1, 40))
    features = tiny_target.features(ids, torch.ones_like(ids))
    anchors = torch.tensor([[5, 17, 30]], device=ids.device)
    tokens = ids.gather(1, anchors)
    together = drafter(features, tokens, anchors)
    other = tokens.clone()
    other[0, 0] = (other[0, 0] + 1) % tiny_target.config.vocab_size
    changed = drafter(features, other, anchors)
    torch.testing.assert_close(changed[:, 1:], together[:, 1:])
    assert not torch.allclose(changed[:, 0], together[:, 0])
    alone = drafter(features, tokens[:, 1:2], anchors[:, 1:2])
    torch.testing.assert_close(alone[:, 0], together[:, 1], atol=1e-5, rtol=1e-5)


def test_selector_scores_match_a_hand_computation():
    torch.manual_seed(0)
    selector = CandidateSelector(hidden_size=6, vocab_size=10, rank=3)
    for p in selector.parameters():
        torch.nn.init.normal_(p)
    hidden, previous, candidates, unary = torch.randn(6), torch.tensor([2, 7]), torch.tensor([1, 4, 9]), torch.randn(3)
    scores = selector.pair_scores(hidden, previous, candidates, unary)
    gate = selector.hidden_projection.weight @ hidden
    for i, a in enumerate(previous.tolist()):
        for j, b in enumerate(candidates.tolist()):
            by_hand = unary[j] + sum(selector.predecessor_codebook[a, r] * gate[r] * selector.successor_codebook[b, r]
                                     for r in range(3))
            torch.testing.assert_close(scores[i, j], by_hand)


def test_viterbi_finds_the_brute_force_best_chain():
    generator = torch.Generator().manual_seed(1)
    first, later = torch.randn(5, 3, generator=generator), torch.randn(5, 3, 3, 3, generator=generator)
    path = viterbi_path(first, later)
    for n in range(5):
        def total(chain):
            return first[n, chain[0]] + sum(later[n, t, chain[t], chain[t + 1]] for t in range(3))
        best = max(itertools.product(range(3), repeat=4), key=total)
        assert tuple(path[n].tolist()) == best


def test_dflash2_chain_is_the_selector_path_and_top1_without_pair_scores(tiny_target):
    drafter = make_drafter(tiny_target, architecture="dflash2")
    ids = random_ids(tiny_target, (1, 30))
    features = tiny_target.features(ids, torch.ones_like(ids))
    anchors = torch.tensor([[4, 12]], device=ids.device)
    hidden = drafter(features, ids.gather(1, anchors), anchors)[0]
    logits = drafter.lm_head(hidden[:, 1:])
    with torch.no_grad():
        drafter.candidate_selector.hidden_projection.weight.zero_()
    assert torch.equal(drafter.chain(hidden, ids[0, anchors[0]]), logits.argmax(dim=-1))
    with torch.no_grad():
        drafter.candidate_selector.hidden_projection.weight.normal_(std=30.0)
    chain = drafter.chain(hidden, ids[0, anchors[0]])
    unary, candidates = logits.topk(TINY_DFLASH2["selector_top_k"], dim=-1)
    first, later = drafter.candidate_selector.block_scores(hidden[:, 1:], ids[0, anchors[0]], candidates, unary)
    assert torch.equal(chain, candidates.gather(-1, viterbi_path(first, later)[..., None])[..., 0])
    assert not torch.equal(chain, logits.argmax(dim=-1))   # the pair scores changed the choice somewhere
