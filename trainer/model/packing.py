"""The target's feature pass without padding: a batch's sequences packed into one row, attention kept inside each
sequence (document-causal), positions restarting per sequence, and the tapped states put back in the batch's
padded layout for the drafter. The linear-attention layers of a hybrid target keep each sequence apart too
(`packed_linear_attention`): with flash-linear-attention, its conv1d and delta-rule kernels take the sequences'
bounds; on transformers' torch path the conv1d sees zeros before each sequence and the delta rule runs the
sequences one by one.

At the seed's buckets about a sixth of a right-padded batch is padding that the target's layers compute and
throw away. Packed, every computed token is real. Attention runs through a function registered with
transformers' attention interface for the duration of one feature pass (`packed_attention`): torch's
variable-length flash attention (`torch.nn.attention.varlen`) on a GPU, and SDPA with a dense document mask
elsewhere (CPU tests, small batches).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch

IMPLEMENTATION = "dflash_packed"   # the name the target's attention layers look up while a packed pass runs
# how a packed pass's sequences reach the attention function through the decoder layers: keywords of tensors
# only (a compiled layer takes them as graph inputs of any size; a plan object would be guarded field by field)
CU_SEQLENS, LENGTHS = "dflash_cu_seqlens", "dflash_lengths"
# what transformers' Gated DeltaNet hands its delta rule besides q, k, v, g and beta that the rule itself reads
RULE_OPTIONS = ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel")


@dataclass(frozen=True)
class PackPlan:
    """Where each real token of a right-padded [B, S] batch goes in the packed row of T = sum(lengths) tokens."""

    index: torch.Tensor        # [T] int64, on the device: flat position (row * S + column) of each packed token
    position_ids: torch.Tensor  # [1, T] int64, on the device: the column, i.e. the position inside its sequence
    cu_seqlens: torch.Tensor   # [N + 1] int32, on the device: where each sequence starts in the packed row
    lengths: tuple[int, ...]   # per row of the batch (rows of length 0 are left out of cu_seqlens)
    shape: tuple[int, int]     # (B, S)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def sequence_lengths(self) -> torch.Tensor:
        """[N] int64 on the host: the lengths of the rows that are not empty (the sequences of cu_seqlens)."""
        return torch.tensor([n for n in self.lengths if n])

    @property
    def padding_share(self) -> float:
        """The share of the padded batch's positions that are padding (what the unpacked pass computed for
        nothing)."""
        return 1.0 - self.tokens / (self.shape[0] * self.shape[1])


def plan(attention_mask: torch.Tensor, device: torch.device) -> PackPlan:
    """The plan of a right-padded CPU mask [B, S] (read on the host, so nothing waits for the GPU); the index
    tensors are copied to `device` without blocking."""
    batch, seq_len = attention_mask.shape
    lengths = attention_mask.sum(dim=1).tolist()
    columns = torch.cat([torch.arange(n) for n in lengths])
    rows = torch.repeat_interleave(torch.arange(batch), torch.tensor(lengths))
    cu = torch.tensor([0] + [n for n in lengths if n], dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def put(tensor: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)

    return PackPlan(index=put(rows * seq_len + columns), position_ids=put(columns[None]), cu_seqlens=put(cu),
                    lengths=tuple(lengths), shape=(batch, seq_len))


def attention_kwargs(plan_: PackPlan) -> dict[str, torch.Tensor]:
    """What the decoder layers hand on to `packed_attention_forward` during a packed pass."""
    return {CU_SEQLENS: plan_.cu_seqlens, LENGTHS: plan_.sequence_lengths}


def pack(tokens: torch.Tensor, plan_: PackPlan) -> torch.Tensor:
    """[B, S] -> [1, T]: the real tokens in order, row after row."""
    return tokens.flatten()[plan_.index][None]


def unpack(packed: torch.Tensor, plan_: PackPlan) -> torch.Tensor:
    """[1, T, D] -> [B, S, D]: each token back at its place; padded positions are zero (never NaN: the drafter
    keeps them out of every block's view, but a NaN there would still poison an attention product)."""
    batch, seq_len = plan_.shape
    out = packed.new_zeros(batch * seq_len, packed.shape[-1])
    out.index_copy_(0, plan_.index, packed[0])
    return out.view(batch, seq_len, -1)


@functools.lru_cache(maxsize=1)
def _varlen():
    """torch's variable-length flash attention and the keywords this release takes, or None (older torch)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def varlen_available(device: torch.device) -> bool:
    return device.type == "cuda" and _varlen() is not None


def supports_window() -> bool:
    found = _varlen()
    return found is not None and "window_size" in found[1]


_lean_inputs = True   # False once this torch's varlen kernel has refused strided views or grouped key/value heads


def _varlen_attention(query, key, value, cu_seqlens: torch.Tensor, longest: int, *, scale: float,
                      window: int | None):
    """query [1, Hq, T, D], key/value [1, Hkv, T, D] -> [1, T, Hq, D] through flash attention's varlen kernel.

    Flash reads each token's row through its stride and serves a group of query heads from one key/value head, so
    the [T, heads, D] views go in as they come: no copy of q, k or v (v is a slice of the merged q/k/v product in
    a compiled layer) and no repeated key/value heads (4 x their size at 8B). A torch whose varlen_attn refuses
    that gets the inputs it wants (contiguous, heads repeated where it takes no GQA flag) from then on."""
    global _lean_inputs
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))   # [T, heads, D] views
    if _lean_inputs:
        try:
            return _varlen_call(q, k, v, cu_seqlens, longest, scale=scale, window=window)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError):
            _lean_inputs = False
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if "enable_gqa" not in _varlen()[1] and q.shape[1] != k.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return _varlen_call(q, k, v, cu_seqlens, longest, scale=scale, window=window)


def _varlen_call(q, k, v, cu_seqlens: torch.Tensor, longest: int, *, scale: float, window: int | None):
    """varlen_attn on [T, heads, D] inputs with the keywords this release takes -> [1, T, Hq, D]."""
    varlen_attn, params = _varlen()
    options = {"scale": scale}
    if "enable_gqa" in params:
        options["enable_gqa"] = q.shape[1] != k.shape[1]
    if "window_size" in params:
        options["window_size"] = (window - 1 if window else -1, 0)
    else:
        options["is_causal"] = True
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, longest, longest, **options)[None]


def document_mask(lengths: torch.Tensor, window: int | None, device: torch.device) -> torch.Tensor:
    """[1, 1, T, T] boolean for sequences of these lengths packed in a row: a token sees the earlier tokens of its
    own sequence (within the window, if any)."""
    document = _documents(lengths).to(device)
    position = torch.cat([torch.arange(int(n)) for n in lengths]).to(device)
    mask = (document[:, None] == document[None, :]) & (position[None, :] <= position[:, None])
    if window:
        mask &= position[:, None] - position[None, :] < window
    return mask[None, None]


@torch.library.custom_op("dflash::packed_attention", mutates_args=())
def packed_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                        lengths: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """Attention inside each packed sequence: query [1, Hq, T, D], key/value [1, Hkv, T, D] -> [1, T, Hq, D];
    `lengths` [N] on the host, `window` 0 for none. One operator to a compiled layer: its graph runs through it
    (no break, so the whole layer is one graph), whatever the batch's sequences."""
    if varlen_available(query.device) and query.dtype in (torch.bfloat16, torch.float16):  # flash: half types
        return _varlen_attention(query, key, value, cu_seqlens, int(lengths.max()), scale=scale,
                                 window=window or None)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=document_mask(lengths, window, query.device), scale=scale)
    return out.transpose(1, 2).contiguous()


@packed_attention_op.register_fake
def _packed_attention_shape(query, key, value, cu_seqlens, lengths, scale, window):
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, sliding_window: int | None = None, **kwargs):
    """The attention function the target's layers call during a packed pass (transformers' interface: returns
    (output [1, T, Hq, D], no weights)); the sequences come as attention_kwargs' keywords."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return packed_attention_op(query, key, value, kwargs[CU_SEQLENS], kwargs[LENGTHS], scale,
                               sliding_window or 0), None


@functools.lru_cache(maxsize=1)
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, packed_attention_forward)


@contextmanager
def packed_attention(config):
    """The target's attention layers call `packed_attention_forward` inside this block (they read the config's
    implementation on every call), and their own implementation again after it."""
    _register()
    previous = config._attn_implementation
    config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation = previous


def _documents(lengths: torch.Tensor) -> torch.Tensor:
    """[T] on the host: the index of the sequence each packed token belongs to, for sequences of these lengths."""
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths)


def document_ids(plan_: PackPlan) -> torch.Tensor:
    """[T]: the index of the sequence each packed token belongs to (built on the host: no wait for the GPU)."""
    return _documents(plan_.sequence_lengths).to(plan_.index.device, non_blocking=True)


def _conv_per_sequence(conv, plan_: PackPlan, documents: torch.Tensor, hidden_states, weight, bias=None,
                       activation=None, **_ignored):
    """transformers' causal conv1d ([1, C, T]) over the packed row with kernel-1 zeros before every sequence, so no
    sequence sees the end of the one before it; the outputs of the real positions only. `documents`: the plan's
    document_ids, computed once per pass, not once per layer."""
    gap = weight.shape[-1] - 1
    positions = torch.arange(hidden_states.shape[-1], device=hidden_states.device) + gap * (documents + 1)
    gapped = hidden_states.new_zeros(*hidden_states.shape[:-1], hidden_states.shape[-1] + gap * len(plan_.lengths))
    gapped[..., positions] = hidden_states
    return conv(gapped, weight, bias, activation=activation)[..., positions]


def _rule_per_sequence(rule, bounds: "SequenceBounds", native: bool, query, key, value, *, g, beta, **options):
    """The gated delta rule over the packed row, its state restarting at each sequence: flash-linear-attention's
    kernel takes the sequences' bounds itself; the torch reference runs them one by one."""
    options = {k: v for k, v in options.items() if k in RULE_OPTIONS}
    if native:   # fla's own function, called with its own keywords (transformers' binding differs by release)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return chunk_gated_delta_rule(query, key, value, g=g, beta=beta, cu_seqlens=bounds.device,
                                      cu_seqlens_cpu=bounds.host, **options)
    edges = bounds.host.tolist()
    parts = [rule(query[:, s:e], key[:, s:e], value[:, s:e], g=g[:, s:e], beta=beta[:, s:e], **options)[0]
             for s, e in zip(edges, edges[1:])]
    return torch.cat(parts, dim=1), None


def _fla_conv(bounds: "SequenceBounds", hidden_states, weight, bias=None, activation=None, **_ignored):
    """transformers' causal conv1d ([1, C, T]) through flash-linear-attention's kernel, which restarts at each
    sequence's bound itself (no gap to build)."""
    from fla.modules.causal_conv1d import causal_conv1d

    out, _ = causal_conv1d(hidden_states.transpose(1, 2), weight, bias, activation=activation,
                           cu_seqlens=bounds.device, cu_seqlens_cpu=bounds.host)
    return out.transpose(1, 2)


@dataclass(frozen=True)
class SequenceBounds:
    """A plan's sequence bounds as flash-linear-attention takes them: int64 on the device and on the host (so its
    kernels never wait for the GPU to read them), one tensor object per pass (fla caches what it derives from
    them by identity)."""

    device: torch.Tensor
    host: torch.Tensor

    @classmethod
    def of(cls, plan_: PackPlan) -> "SequenceBounds":
        host = torch.cat([torch.zeros(1, dtype=torch.int64), plan_.sequence_lengths.cumsum(0)])
        return cls(device=plan_.cu_seqlens.long(), host=host)


@contextmanager
def packed_linear_attention(model_type: str, plan_: PackPlan, *, kernel: str):
    """Inside this block the linear-attention layers of a `model_type` target (qwen3_5, qwen3_5_moe) keep the plan's
    sequences apart: transformers' modeling module looks both functions up on every call."""
    name = model_type.removesuffix("_text")
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    conv, rule = module.causal_conv1d_fn, module.torch_chunk_gated_delta_rule
    bounds, native = SequenceBounds.of(plan_), kernel == "fla"
    module.causal_conv1d_fn = (functools.partial(_fla_conv, bounds) if native else
                               functools.partial(_conv_per_sequence, conv, plan_, document_ids(plan_)))
    module.torch_chunk_gated_delta_rule = functools.partial(_rule_per_sequence, rule, bounds, native)
    try:
        yield
    finally:
        module.causal_conv1d_fn, module.torch_chunk_gated_delta_rule = conv, rule
