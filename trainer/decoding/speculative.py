"""Speculative decoding with a DFlash drafter, measured against plain greedy decoding of the same target.

Each round the drafter proposes a block from the target's tapped states of the accepted text; one target
forward over [anchor, drafts...] verifies it; the matching prefix plus the target's own next token (the bonus)
is accepted. The output is therefore exactly the target's greedy output; tau is the mean number of tokens
accepted per verification forward.

After a rejection the target's cache must forget the rejected drafts. A KV cache is cropped. A hybrid target's
linear-attention layers hold one recurrent state that has already absorbed every draft and cannot be cropped:
the cache as it stood before the verify pass is kept aside, restored, and the accepted tokens are fed again.

This is the one-prompt-at-a-time path, for sliding-window targets. `trainer eval` and training's held-out
decoding decode the other targets many prompts at once (trainer/decoding/batched.py), hybrids too.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch


class LayerTaps:
    """Forward hooks that keep the outputs of the tapped decoder layers of the last forward pass."""

    def __init__(self, model, layer_ids: list[int]):
        self.outputs: dict[int, torch.Tensor] = {}
        layers = model.base_model.layers
        self.handles = [layers[i].register_forward_hook(self._keeper(i)) for i in layer_ids]
        self.layer_ids = list(layer_ids)

    def _keeper(self, index: int):
        def keep(module, args, output):
            self.outputs[index] = output[0] if isinstance(output, tuple) else output
        return keep

    def features(self) -> torch.Tensor:
        """[1, n, k*H] of the last forward, in tap order."""
        return torch.cat([self.outputs[i] for i in self.layer_ids], dim=-1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class Decoded:
    tokens: list[int]
    seconds: float
    accepted_per_round: list[int] = field(default_factory=list)  # tokens each round kept (after the final cut)
    rejected_rounds: int = 0  # rounds whose draft the target refused somewhere
    # the target's best logits (values, ids) where it chose each token, when asked for (greedy references)
    top: list[tuple[list[float], list[int]]] = field(default_factory=list)


@dataclass
class DecodeRun:
    """Every prompt's output of one way of decoding, and the wall time of all of it."""

    outputs: list[Decoded]
    seconds: float

    @property
    def new_tokens(self) -> int:
        return sum(len(out.tokens) for out in self.outputs)

    @property
    def rounds(self) -> list[int]:
        return [n for out in self.outputs for n in out.accepted_per_round]

    def tok_per_s(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


def cache_argument(model) -> str:
    import inspect

    # transformers 5 renamed past_key_values to cache
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _forward(model, ids: list[int] | torch.Tensor, cache) -> torch.Tensor:
    """Logits [n, V] (float32) of the new tokens, which the cache takes in."""
    input_ids = torch.as_tensor(ids, device=model.device).view(1, -1)
    kwargs = {cache_argument(model): cache}
    return model(input_ids=input_ids, use_cache=True, **kwargs).logits[0].float()


def _new_cache(model):
    from transformers import DynamicCache

    # a hybrid target's cache needs the config to give its linear-attention layers their state slots; others
    # keep the plain cache, whose every layer crops (a sliding-window layer made from the config would not)
    return DynamicCache(config=model.config) if has_recurrent_state(model) else DynamicCache()


def has_recurrent_state(model) -> bool:
    """True for targets with linear-attention layers, whose cache cannot be cropped."""
    return "linear_attention" in (getattr(model.config, "layer_types", None) or ())


def _crop(cache, length: int) -> None:
    """Forget the cached positions from `length` on (a negative crop removes that many: every version agrees)."""
    surplus = cache.get_seq_length() - length
    if surplus > 0:
        cache.crop(-surplus)


def finish(tokens: list[int], *, max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut at the first end-of-sequence token (kept) or at max_new_tokens; True when decoding is done."""
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos_ids:
            return tokens[:i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


Top = tuple[list[float], list[int]]  # the k best logits of one position and their ids, best first


def top_logits(logits: torch.Tensor, k: int = 8) -> Top:
    """The k best (values, ids) of one position's logits: what a divergence's margin is read from."""
    return top_logits_rows(logits[None], k)[0]


def top_logits_rows(logits: torch.Tensor, k: int = 8) -> list[Top]:
    """Top of each row of logits [N, V], with one top-k and one copy to the host for them all (a copy per row
    costs a sync each, which doubled the time of a batched greedy round)."""
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return list(zip(values.float().tolist(), ids.tolist()))


@torch.no_grad()
def greedy_decode(model, prompt_ids: list[int], *, max_new_tokens: int, eos_ids: set[int],
                  record_top: bool = False) -> Decoded:
    started = time.perf_counter()
    cache = _new_cache(model)
    logits = _forward(model, prompt_ids, cache)[-1]
    tokens, top = [int(logits.argmax())], [top_logits(logits)] if record_top else []
    while not finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)[1]:
        logits = _forward(model, tokens[-1:], cache)[-1]
        tokens.append(int(logits.argmax()))
        top += [top_logits(logits)] if record_top else []
    tokens, _ = finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    return Decoded(tokens=tokens, seconds=time.perf_counter() - started, top=top[:len(tokens)])


@torch.no_grad()
def speculative_decode(model, drafter, taps: LayerTaps, prompt_ids: list[int], *, max_new_tokens: int,
                       eos_ids: set[int]) -> Decoded:
    started = time.perf_counter()
    recurrent = has_recurrent_state(model)
    cache = _new_cache(model)
    logits = _forward(model, prompt_ids, cache)
    features = taps.features()  # states of every accepted position before the anchor
    tokens = [int(logits[-1].argmax())]
    accepted_per_round: list[int] = []
    rejected = 0
    done = finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)[1]
    while not done:
        anchor_pos = len(prompt_ids) + len(tokens) - 1
        draft = drafter.draft(features.to(drafter.fc.weight.dtype), tokens[-1], anchor_pos).tolist()
        before = copy.deepcopy(cache) if recurrent else None
        verified = _forward(model, [tokens[-1], *draft], cache).argmax(dim=-1).tolist()
        n = 0
        while n < len(draft) and draft[n] == verified[n]:
            n += 1
        accepted = [*draft[:n], verified[n]]  # the matching prefix plus the target's own next token
        features = torch.cat([features, taps.features()[:, :n + 1]], dim=1)
        if before is None:
            _crop(cache, anchor_pos + n + 1)
        elif n < len(draft):  # roll the recurrent state back to the anchor, then take the accepted tokens in
            cache = before
            _forward(model, [tokens[-1], *draft[:n]], cache)
        rejected += n < len(draft)
        kept_before = len(tokens)
        tokens, done = finish(tokens + accepted, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
        accepted_per_round.append(len(tokens) - kept_before)  # what max_new_tokens / an end token left of it
    return Decoded(tokens=tokens, seconds=time.perf_counter() - started, accepted_per_round=accepted_per_round,
                   rejected_rounds=rejected)
