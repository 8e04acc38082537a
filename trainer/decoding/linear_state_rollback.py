"""A hybrid target's linear-attention states in a batched decode: each row put back as if it had taken in only
the tokens it accepted.

A Gated DeltaNet layer keeps, per row, a recurrent state and the last few inputs of its short convolution. A verify
pass feeds every row its whole draft, so both have absorbed the refused drafts too, and no mask can take them out
afterwards. Before the pass each linear layer's states are kept aside and the pass records what it fed each
layer. Afterwards the states are restored and only the linear layers run again over those recorded inputs, with
every refused position made a no-op: its write strength (beta) is 0 and its decay exp(g) is 1, so the delta
rule's state passes it unchanged. The convolution's state is then cut from the recorded inputs at each row's own
length. The other layers are not run again, and the verify pass's outputs at the accepted positions are already
exact (causal), so the cost is the linear layers' projections once more, not a second target forward.

Works with transformers' torch path and with flash-linear-attention's kernels alike: both read beta and g.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def linear_layers(model) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, Gated DeltaNet module) of each linear-attention layer of a hybrid target."""
    return [(i, layer.linear_attn) for i, layer in enumerate(model.base_model.layers)
            if getattr(layer, "linear_attn", None) is not None]


def _cache_keyword(module) -> str:
    # transformers 5.17 calls the cache cache_params; later releases call it cache (and warn on the old name)
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "cache_params"


@dataclass
class _Kept:
    conv: torch.Tensor  # [A, C, W] the convolution's last inputs before the pass
    recurrent: torch.Tensor  # [A, Hv, Dk, Dv] the delta rule's state before the pass


class LinearStates:
    """The linear-attention layers of a hybrid target and their states in one batched cache."""

    def __init__(self, model, cache):
        self.cache = cache
        self.layers = linear_layers(model)
        self.keyword = _cache_keyword(self.layers[0][1]) if self.layers else "cache"

    @contextmanager
    def verifying(self):
        """Around one verify forward: yields a Verified that can later rewind each row to its accepted length."""
        verified = Verified(self, kept={}, inputs={})
        for index, _ in self.layers:
            layer = self.cache.layers[index]
            verified.kept[index] = _Kept(layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
        handles = [module.register_forward_pre_hook(functools.partial(_record_input, verified.inputs, index),
                                                    with_kwargs=True)
                   for index, module in self.layers]
        try:
            yield verified
        finally:
            for handle in handles:
                handle.remove()

    def select_rows(self, index: torch.Tensor) -> None:
        for layer_index, _ in self.layers:
            self.cache.layers[layer_index].reorder_cache(index)


def _record_input(inputs: dict, index: int, module, args, kwargs) -> None:
    inputs[index] = args[0] if args else kwargs["hidden_states"]


@dataclass
class Verified:
    """What one verify pass left: each linear layer's states before it and the inputs it fed the layer."""

    states: LinearStates
    kept: dict[int, _Kept]
    inputs: dict[int, torch.Tensor]  # [A, L, H] per linear layer

    def rewind(self, lengths: torch.Tensor) -> None:
        """Make each row's states those after its first lengths[r] fed positions (the anchor and the accepted
        drafts); a round where every row kept everything needs nothing."""
        width = next(iter(self.inputs.values())).shape[1]
        if bool((lengths >= width).all()):
            return
        live = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]  # [A, L]
        for index, module in self.states.layers:
            self._rerun(index, module, live, lengths)

    def _rerun(self, index: int, module, live: torch.Tensor, lengths: torch.Tensor) -> None:
        layer, kept = self.states.cache.layers[index], self.kept[index]
        layer.conv_states[0].copy_(kept.conv)
        layer.recurrent_states[0].copy_(kept.recurrent)
        fed: list[torch.Tensor] = []

        def no_op(mod, args, out):  # a refused position's beta and g projections: sigmoid(min) = 0, no write;
            return out.masked_fill(~live[..., None], torch.finfo(out.dtype).min)  # softplus(min) = 0: no decay

        handles = [module.in_proj_qkv.register_forward_hook(lambda mod, args, out: fed.append(out)),
                   module.in_proj_b.register_forward_hook(no_op), module.in_proj_a.register_forward_hook(no_op)]
        try:
            module(self.inputs[index], **{self.states.keyword: self.states.cache})
        finally:
            for handle in handles:
                handle.remove()
        # the convolution keeps the last W inputs it saw: for each row, those ending at its own length
        window = kept.conv.shape[-1]
        seen = torch.cat([kept.conv, fed[0].transpose(1, 2).to(kept.conv.dtype)], dim=-1)  # [A, C, W + L]
        columns = lengths[:, None] + torch.arange(window, device=lengths.device)[None, :]  # [A, W]
        layer.conv_states[0].copy_(seen.gather(2, columns[:, None, :].expand(-1, seen.shape[1], -1)))
