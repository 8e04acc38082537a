"""DFlash2: the block convolution stays inside its block, the selector's scores and path, the drafter's chain."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
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


def test_training_candidates_put_a_missing_label_in_the_weakest_place():
    from trainer.training.selector_objective import chunk_candidates

    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    unary, ids = chunk_candidates(logits, torch.tensor([1, 4]), 3)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 4]]
    assert unary.tolist() == [[5.0, 4.0, 3.0], [5.0, 4.0, 1.0]]


@pytest.mark.parametrize("vocab", [151936, 4096 + 77, 1000, 40])
def test_the_blockwise_top_k_gives_torch_topks_values(vocab):
    """Rows whose best values crowd into one block, sit in the shorter last block, or tie: the same values, best
    first, and ids that point at them (a vocabulary of fewer than k + 1 blocks takes torch.topk itself)."""
    from trainer.training.selector_objective import blockwise_topk

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=g).to(torch.bfloat16)
    logits[0, :20] = 10.0 + torch.arange(20)        # the 16 best all in the first block
    logits[1, -5:] = 20.0 + torch.arange(5)         # some of the best in the last, short block
    logits[2] = 1.0                                  # every value tied
    logits[3, ::7] = 30.0
    values, ids = blockwise_topk(logits, 16)
    want = logits.topk(16, dim=-1).values
    assert torch.equal(values, want) and torch.equal(logits.gather(1, ids), values)
    assert (ids.sort(dim=-1).values.diff(dim=-1) > 0).all()   # 16 distinct columns per row


@pytest.mark.parametrize("objective", [{"ce": 1.0}, {"ce": 0.5, "cap": 0.5}])
def test_the_losses_give_the_selectors_candidates_from_their_own_chunks(objective):
    """Both chunked losses (the plain CE's and the general one) hand back each row's top-K of the logits they
    computed, chunk by chunk, equal to the top-K over the whole [rows, vocab] logits: no second LM-head pass."""
    from trainer.training.losses import Objective, chunked_objective
    from trainer.training.objective import chunked_weighted_ce
    from trainer.training.selector_objective import chunk_candidates

    torch.manual_seed(0)
    slots, blocks, vocab, k = 3, 8, 50, 4
    hidden, head = torch.randn(slots * blocks, 16), torch.randn(vocab, 16)
    labels = torch.randint(0, vocab, (slots * blocks,))
    whole = chunk_candidates(hidden @ head.t(), labels, k)
    supervised, decay = torch.ones_like(labels, dtype=torch.bool), torch.ones(slots * blocks)
    for chunk_blocks in (1, 3, blocks):
        if objective == {"ce": 1.0}:
            out = chunked_weighted_ce(hidden, head, labels, decay, chunk_rows=chunk_blocks * slots, top_k=k)
        else:
            out = chunked_objective(hidden, head, labels, supervised, decay, Objective(objective, "decay"), slots=slots,
                                    chunk_blocks=chunk_blocks, top_k=k)
        assert torch.equal(out.candidates[1], whole[1]) and torch.allclose(out.candidates[0], whole[0])
    assert chunked_weighted_ce(hidden, head, labels, decay).candidates is None


class HostWaits(TorchDispatchMode):
    """The aten calls that make the host wait for a CUDA device, recorded on any device: a data-dependent shape
    (nonzero, masked_select, a boolean-mask index) or a value read back (item, is_nonzero, equal)."""

    WAITING = {"aten.nonzero", "aten._local_scalar_dense", "aten.is_nonzero", "aten.masked_select", "aten.equal"}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        indices = args[1] if name in ("aten.index", "aten.index_put", "aten.index_put_") else ()
        if name in self.WAITING or any(i is not None and i.dtype == torch.bool for i in indices):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("objective", [{"ce": 1.0}, {"ce": 1.0, "cap": 0.5}])
def test_the_losses_chunk_loop_never_waits_for_the_device_when_it_takes_candidates(objective):
    """A host wait inside the chunk loop (~50 chunks a step at 8B) leaves the GPU idle while each chunk's Python
    runs: DFlash2's candidates cost 11.6 % of DFlash's tok/s while chunk_candidates took them with boolean-mask
    assignments. The loop, the candidates and the backward call nothing that waits."""
    from trainer.training.losses import Objective, chunked_objective
    from trainer.training.objective import chunked_weighted_ce

    torch.manual_seed(0)
    slots, blocks, vocab, k = 3, 8, 50, 4
    hidden, head = torch.randn(slots * blocks, 16, requires_grad=True), torch.randn(vocab, 16)
    labels = torch.randint(0, vocab, (slots * blocks,))
    supervised, decay = torch.ones_like(labels, dtype=torch.bool), torch.ones(slots * blocks)
    with HostWaits() as waits:
        if objective == {"ce": 1.0}:
            out = chunked_weighted_ce(hidden, head, labels, decay, chunk_rows=2 * slots, top_k=k)
        else:
            out = chunked_objective(hidden, head, labels, supervised, decay, Objective(objective, "dpace"),
                                    slots=slots, chunk_blocks=2, top_k=k)
        out.loss.backward()
    assert waits.seen == []
    assert hidden.grad is not None and out.candidates[1].shape == (slots * blocks, k)


def test_the_selector_scores_slot_k_after_the_texts_token_before_it():
    from trainer.training.selector_objective import previous_tokens

    input_ids = torch.arange(100, 120)[None]
    assert previous_tokens(input_ids, torch.tensor([[3, 10]]), 4).tolist() == [[[103, 104, 105, 106],
                                                                                 [110, 111, 112, 113]]]


def test_training_a_dflash2_drafter_lowers_both_losses(tiny_target):
    from trainer.training.objective import IGNORE, block_labels, decay_weights, dflash_step
    from trainer.training.selector_objective import chunk_candidates, selector_loss

    drafter = make_drafter(tiny_target, architecture="dflash2", block_size=6).train()
    pattern = random_ids(tiny_target, (1, 7), seed=5)
    input_ids = pattern.repeat(2, 8)                      # a text the drafter can learn in a few steps
    loss_mask = torch.ones_like(input_ids)
    features = tiny_target.features(input_ids, loss_mask)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=1e-2)
    anchors = torch.tensor([[3, 9, 20, 33], [1, 14, 27, 40]], device=input_ids.device)
    labels = block_labels(input_ids, loss_mask, anchors, 6)
    weights = decay_weights(6, 4.0, device=labels.device) * (labels != IGNORE)

    def selector_part() -> float:
        with torch.no_grad():
            hidden = drafter(features, input_ids.gather(1, anchors), anchors)[:, :, 1:]
            logits = hidden.reshape(-1, hidden.shape[-1]) @ drafter.lm_head.weight.t()
            candidates = chunk_candidates(logits, labels.clamp(min=0).flatten(), drafter.selector_top_k)
            return selector_loss(drafter, hidden, input_ids, anchors, labels.clamp(min=0), weights,
                                 candidates)[0].item()

    initial_selector = {k: v.clone() for k, v in drafter.candidate_selector.state_dict().items()}
    losses = []
    for step in range(25):
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=8, block_size=6, gamma=4.0,
                          noise=0.0, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0]
    trained = selector_part()
    drafter.candidate_selector.load_state_dict(initial_selector)   # the trained backbone, an untrained selector
    assert trained < 0.8 * selector_part()


@pytest.mark.parametrize("seed", range(3))
def test_paired_best_first_keeps_exactly_the_most_likely_nodes(seed):
    from trainer.decoding.draft_tree import best_first_paired

    generator = torch.Generator().manual_seed(seed)
    slots, k = 3, 3
    first = torch.log_softmax(torch.randn(k, generator=generator), -1).tolist()
    later = torch.log_softmax(torch.randn(slots - 1, k, k, generator=generator), -1).tolist()
    ids = [[10 * (d + 1) + i for i in range(k)] for d in range(slots)]

    def score(path):
        return first[path[0]] + sum(later[d][path[d]][path[d + 1]] for d in range(len(path) - 1))

    every = sorted((path for depth in range(1, slots + 1) for path in itertools.product(range(k), repeat=depth)),
                   key=score, reverse=True)
    for budget in (1, 3, 7, 20, 39):
        tree = best_first_paired(7, first, later, ids, budget)
        assert len(tree) == budget + 1 and tree.parents[0] == -1
        paths = set()
        for node in range(1, len(tree)):
            path, at = [], node
            while at > 0:
                path.append(tree.tokens[at] % 10)
                at = tree.parents[at]
            paths.add(tuple(reversed(path)))
        assert paths == set(every[:budget]), budget


def test_a_run_resumes_only_with_the_architecture_and_sizes_it_was_trained_with(tmp_path):
    import json

    from trainer.config import config_from_dict
    from trainer.errors import TrainerError
    from trainer.training.checkpoints import TRAINER_CONFIG_FILE, check_resumable

    required = {"target_path": "t", "data_path": "d", "output_dir": "o"}
    plain = config_from_dict(required, source="x")
    older = plain.model_dump()
    for key in ("architecture", "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        older.pop(key)   # a checkpoint written before DFlash2 existed: a DFlash run
    (tmp_path / TRAINER_CONFIG_FILE).write_text(json.dumps(older))
    check_resumable(tmp_path, plain)
    with pytest.raises(TrainerError, match="architecture: 'dflash' -> 'dflash2'"):
        check_resumable(tmp_path, config_from_dict({**required, "architecture": "dflash2", "block_size": 16},
                                                   source="x"))
    dflash2 = config_from_dict({**required, "architecture": "dflash2"}, source="x")
    (tmp_path / TRAINER_CONFIG_FILE).write_text(json.dumps(dflash2.model_dump()))
    with pytest.raises(TrainerError, match="selector_top_k: 16 -> 8"):
        check_resumable(tmp_path, config_from_dict({**required, "architecture": "dflash2", "selector_top_k": 8},
                                                   source="x"))
