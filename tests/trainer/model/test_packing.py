"""The target's packed feature pass: every real position equals the padded pass's, nothing leaks between the
sequences packed into one row, and the layers compute real tokens only."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.tiny_models import device, tiny_target, tiny_target_dir  # noqa: F401  (fixtures)
from tests.trainer.model.test_target import _hf_tapped_states, _write_other_target
from trainer.model import packing
from trainer.model.target import TargetModel
from trainer.planning.target_families import LINEAR


def _mixed_batch(vocab_size: int, lengths: list[int], seed: int = 0):
    """A right-padded batch with rows of the given lengths (the trainer's layout) and its CPU mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.randint(0, vocab_size, (len(lengths), width), generator=generator)
    attention_mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


def _padded_and_packed(target, input_ids, attention_mask):
    target.packing = False
    try:
        padded = target.features(input_ids, attention_mask)
    finally:
        target.packing = True
    packed = target.features(input_ids, attention_mask)
    target.packing = "auto"
    return padded, packed


@pytest.mark.parametrize("lengths", [[24, 17, 5, 24], [3, 30], [1, 9, 9, 2, 16]])
def test_packed_features_equal_padded_features_at_every_real_position(tiny_target, lengths):
    input_ids, attention_mask = _mixed_batch(tiny_target.config.vocab_size, lengths)
    padded, packed = _padded_and_packed(tiny_target, input_ids, attention_mask)
    real = attention_mask.bool().to(tiny_target.device)
    assert packed.shape == padded.shape
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    assert bool((packed[~real] == 0).all())   # padded positions: zero, never garbage


def test_packed_final_states_equal_padded_ones(tiny_target):
    """The final states an objective against the target's distribution reads come out of the packed pass as out of
    the padded one."""
    input_ids, attention_mask = _mixed_batch(tiny_target.config.vocab_size, [24, 9, 17], seed=3)
    try:
        tiny_target.packing = False
        _, padded = tiny_target.features(input_ids, attention_mask, final=True)
        tiny_target.packing = True
        _, packed = tiny_target.features(input_ids, attention_mask, final=True)
    finally:
        tiny_target.packing = "auto"
    real = attention_mask.bool().to(tiny_target.device)
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)


def test_each_packed_sequence_equals_the_sequence_run_alone(tiny_target):
    """Nothing of one sequence reaches another in the packed row (positions restart, attention stays inside)."""
    lengths = [11, 20, 7]
    input_ids, attention_mask = _mixed_batch(tiny_target.config.vocab_size, lengths, seed=4)
    tiny_target.packing = True
    try:
        packed = tiny_target.features(input_ids, attention_mask)
    finally:
        tiny_target.packing = "auto"
    for row, n in enumerate(lengths):
        with torch.no_grad():
            alone = _hf_tapped_states(tiny_target, input_ids[row:row + 1, :n].to(tiny_target.device))
        torch.testing.assert_close(packed[row, :n], alone[0], rtol=1e-5, atol=1e-5)


def test_the_packed_pass_computes_real_tokens_only(tiny_target):
    seen = []
    hook = tiny_target.decoder.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape))
    input_ids, attention_mask = _mixed_batch(tiny_target.config.vocab_size, [12, 3, 7])
    tiny_target.packing = True
    try:
        tiny_target.features(input_ids, attention_mask)
    finally:
        tiny_target.packing = "auto"
        hook.remove()
    assert seen == [torch.Size([1, 22, tiny_target.hidden_size])]


@pytest.mark.parametrize("kind", ["llama", "qwen3_sliding"])
def test_packed_features_of_other_targets(tmp_path, kind):
    target = TargetModel.load(_write_other_target(tmp_path, kind), layer_ids=[1, 3], num_taps=2)
    input_ids, attention_mask = _mixed_batch(target.config.vocab_size, [20, 13, 8], seed=2)
    padded, packed = _padded_and_packed(target, input_ids, attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)


def test_plan_reads_the_mask_on_the_host():
    _, attention_mask = _mixed_batch(10, [4, 1, 3])
    plan = packing.plan(attention_mask, torch.device("cpu"))
    assert plan.index.tolist() == [0, 1, 2, 3, 4, 8, 9, 10]
    assert plan.position_ids.tolist() == [[0, 1, 2, 3, 0, 0, 1, 2]]
    assert plan.cu_seqlens.tolist() == [0, 4, 5, 8] and plan.cu_seqlens.dtype == torch.int32
    assert plan.sequence_lengths.tolist() == [4, 1, 3] and plan.padding_share == pytest.approx(1 - 8 / 12)


class _StandInVarlen:
    """torch's varlen_attn as a release without a GQA flag behaves (attention inside each sequence, grouped heads
    served natively), optionally refusing what a stricter release refuses: strided views, unequal head counts."""

    PARAMS = frozenset({"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "scale", "window_size"})

    def __init__(self, strict: bool):
        self.strict, self.calls = strict, []

    def __call__(self, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale, window_size):
        self.calls.append((q, k, v))
        if self.strict and (not all(t.is_contiguous() for t in (q, k, v)) or q.shape[1] != k.shape[1]):
            raise RuntimeError("varlen_attn: contiguous inputs of equal head counts only")
        assert window_size == (-1, 0) and int(cu_seq_q[-1]) == q.shape[0] and max_q == max_k
        groups = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(groups, dim=1).transpose(0, 1)[None] for t in (k, v))
        mask = packing.document_mask(cu_seq_q.diff(), None, q.device)
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask,
                                                                scale=scale)[0].transpose(0, 1)


def _merged_qkv(lengths: list[int], heads: int = 4, kv_heads: int = 2, size: int = 8):
    """q [1, Hq, T, D] and k, v [1, Hkv, T, D] as a compiled layer hands them over: views of one merged product."""
    tokens = sum(lengths)
    merged = torch.randn(tokens, heads + 2 * kv_heads, size, generator=torch.Generator().manual_seed(3))
    q, k, v = merged.split([heads, kv_heads, kv_heads], dim=1)
    return merged, *(t.transpose(0, 1)[None] for t in (q, k, v))


@pytest.mark.parametrize("strict", [False, True])
def test_varlen_attention_hands_flash_its_views_and_copies_only_for_a_release_that_refuses(monkeypatch, strict):
    lengths = [5, 3, 7]
    cu_seqlens = torch.tensor([0, 5, 8, 15], dtype=torch.int32)
    merged, query, key, value = _merged_qkv(lengths)
    stand_in = _StandInVarlen(strict)
    monkeypatch.setattr(packing, "_varlen", lambda: (stand_in, _StandInVarlen.PARAMS))
    monkeypatch.setattr(packing, "_lean_inputs", True)
    expected = packing.packed_attention_op(query, key, value, cu_seqlens, torch.tensor(lengths), 0.5, 0)
    for _ in range(2):
        got = packing._varlen_attention(query, key, value, cu_seqlens, max(lengths), scale=0.5, window=None)
        torch.testing.assert_close(got, expected)
    first_q, first_k, _ = stand_in.calls[0]
    # the first try: the merged product's own memory, the key/value heads as they are
    assert first_q.data_ptr() == merged.data_ptr() and first_k.shape[1] == 2
    if strict:
        # refused once, then copies with repeated heads straight away: three calls for two attentions
        assert len(stand_in.calls) == 3 and packing._lean_inputs is False
        assert all(t.is_contiguous() and t.shape[1] == 4 for t in stand_in.calls[-1])
    else:
        assert len(stand_in.calls) == 2 and packing._lean_inputs is True


def test_auto_packs_only_where_flash_varlen_runs(tiny_target):
    assert tiny_target.packing == "auto"
    assert tiny_target.can_pack() == packing.varlen_available(tiny_target.device)
    tiny_target.packing = False
    try:
        assert not tiny_target.can_pack() and tiny_target.packing_line() == "target batches padded"
    finally:
        tiny_target.packing = "auto"


def test_auto_packs_a_hybrid_only_with_fla_kernels(tmp_path, monkeypatch):
    """Where varlen flash attention runs, auto packs a hybrid when fla runs its linear layers (its kernels take the
    sequences' bounds), not on transformers' torch path (one unbatched delta rule per sequence); true always packs."""
    from trainer.model import target as target_lib
    from trainer.model.tiny_target import write_tiny_target

    target = TargetModel.load(write_tiny_target(tmp_path / "hybrid", family="qwen3.5"), layer_ids=None, num_taps=2)
    monkeypatch.setattr(packing, "varlen_available", lambda device: True)
    for kernel, packs in (("torch", False), ("fla", True)):
        monkeypatch.setattr(target_lib, "linear_attention_kernel", lambda spec, kernel=kernel: kernel)
        assert target.can_pack() is packs, kernel
        target.packing = True
        assert target.can_pack()
        target.packing = "auto"


@pytest.mark.parametrize("family, composite", [("qwen3.5", False), ("qwen3.5", True), ("qwen3.5-moe", False)])
def test_hybrid_targets_pack_only_when_asked_and_then_exactly(tmp_path, family, composite):
    """Gated DeltaNet layers in one packed row: the conv1d and the delta rule's state restart per sequence."""
    from trainer.model.tiny_target import write_tiny_target

    path = write_tiny_target(tmp_path / "hybrid", seed=0, family=family, composite=composite)
    target = TargetModel.load(path, layer_ids=None, num_taps=2)
    assert not target.can_pack()                    # auto: a hybrid is not packed (not measured on a GPU yet)
    input_ids, attention_mask = _mixed_batch(target.config.vocab_size, [70, 9, 33, 130], seed=6)
    padded, packed = _padded_and_packed(target, input_ids, attention_mask)
    real = attention_mask.bool()
    # fp32, but the delta rule's products run per sequence here and batched there (another summation order): a few
    # elements move by ~3e-5 after six layers, against ~1 for a sequence that saw its neighbour
    assert float((packed[real] - padded[real]).norm() / padded[real].norm()) < 1e-5
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-4, atol=1e-4)
    with torch.no_grad():   # and each sequence equals itself alone (nothing crossed from its neighbour)
        alone = _hf_tapped_states(target, input_ids[1:2, :9])
    torch.testing.assert_close(packed[1, :9], alone[0], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_flash_features_match_padded_in_bf16(tiny_target_dir):
    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cuda", dtype=torch.bfloat16)
    assert target.can_pack() and "varlen flash" in target.packing_line()
    input_ids, attention_mask = _mixed_batch(target.config.vocab_size, [200, 37, 129, 64], seed=5)
    padded, packed = _padded_and_packed(target, input_ids, attention_mask)
    real = attention_mask.bool().cuda()
    got, expected = packed[real].float(), padded[real].float()
    # two kernels round bf16 differently (flash varlen against SDPA's causal one), layer after layer: compare as
    # a whole, and every position within a few bf16 steps of its scale
    assert float((got - expected).norm() / expected.norm()) < 1e-2
    torch.testing.assert_close(got, expected, rtol=0.1, atol=0.1 * float(expected.abs().max()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["qwen3.5", "qwen3.5-moe"])
def test_hybrid_packed_features_on_a_gpu_match_padded(tmp_path, family):
    """On a GPU a hybrid packs by default: its Gated DeltaNet layers run flash-linear-attention's conv1d and delta
    rule with the sequences' bounds (the torch path without fla). In fp32 (attention through the document mask,
    fla's dots in TF32) every real position agrees with the padded pass, and a sequence packed beside others equals
    itself packed alone. In bf16 (varlen flash attention) both passes round, and a random tiny model amplifies
    that layer after layer (its MoE router flips experts on near-ties: 3-16 % on an H200), so the packed pass is
    held to the padded one's own distance from the fp32 result rather than to a fixed bound."""
    from trainer.model.tiny_target import write_tiny_target

    path = write_tiny_target(tmp_path / "hybrid", seed=1, family=family)
    lengths = [300, 37, 129, 64, 1]
    reference = None
    for dtype in (torch.float32, torch.bfloat16):
        target = TargetModel.load(path, layer_ids=None, num_taps=3, device="cuda", dtype=dtype)
        assert target.can_pack() == (target.kernels()[LINEAR] == "fla")   # auto: packed with fla's kernels
        input_ids, attention_mask = _mixed_batch(target.config.vocab_size, lengths, seed=7)
        padded, packed = _padded_and_packed(target, input_ids, attention_mask)
        real = attention_mask.bool().cuda()
        got, expected = packed[real].float(), padded[real].float()
        if dtype == torch.float32:
            reference = expected
            torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)
            row = 2
            alone = target.packed_features(input_ids[row:row + 1, :lengths[row]].to(target.device),
                                           packing.plan(attention_mask[row:row + 1, :lengths[row]], target.device))
            # TF32 noise is ~1e-3 of the scale; a neighbour's conv or recurrent state leaking in is O(1) where it
            # lands (the first positions most): compare the whole sequence and its first 8 positions on their own
            for span in (slice(0, lengths[row]), slice(0, 8)):
                diff = float((packed[row, span] - alone[0, span]).norm() / alone[0, span].norm())
                assert diff < 1e-2, (span, diff)
        else:
            packed_error, padded_error = (float((x - reference).norm() / reference.norm()) for x in (got, expected))
            assert packed_error < 2 * padded_error + 1e-2, (packed_error, padded_error)
