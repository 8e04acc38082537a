"""Speculative decoding with a DFlash drafter, measured against plain greedy decoding of the same target.

Each round the drafter proposes a block from the target's tapped states of the accepted text; one target
forward over [anchor, drafts...] verifies it; the matching prefix plus the target's own next token (the bonus)
is accepted. The output is therefore exactly the target's greedy output; tau is the mean number of tokens
accepted per verification forward.

After a rejection the target's cache must forget the rejected drafts. A KV cache is cropped. A hybrid target's
linear-attention layers hold one recurrent state that has already absorbed every draft and cannot be cropped:
the cache as it stood before the verify pass is kept aside, restored, and the accepted tokens are fed again.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.generate import load_target_for_generation, pick_device, read_prompts


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


def _cache_argument(model) -> str:
    import inspect

    # transformers 5 renamed past_key_values to cache
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _forward(model, ids: list[int] | torch.Tensor, cache) -> torch.Tensor:
    input_ids = torch.as_tensor(ids, device=model.device).view(1, -1)
    kwargs = {_cache_argument(model): cache}
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


def _finish(tokens: list[int], *, max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut at the first end-of-sequence token (kept) or at max_new_tokens; True when decoding is done."""
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos_ids:
            return tokens[:i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


@torch.no_grad()
def greedy_decode(model, prompt_ids: list[int], *, max_new_tokens: int, eos_ids: set[int]) -> Decoded:
    started = time.perf_counter()
    cache = _new_cache(model)
    tokens = [int(_forward(model, prompt_ids, cache)[-1].argmax())]
    while not _finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)[1]:
        tokens.append(int(_forward(model, tokens[-1:], cache)[-1].argmax()))
    tokens, _ = _finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    return Decoded(tokens=tokens, seconds=time.perf_counter() - started)


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
    done = _finish(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)[1]
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
        tokens, done = _finish(tokens + accepted, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
        accepted_per_round.append(len(tokens) - kept_before)  # what max_new_tokens / an end token left of it
    return Decoded(tokens=tokens, seconds=time.perf_counter() - started, accepted_per_round=accepted_per_round,
                   rejected_rounds=rejected)


@dataclass
class EvalReport:
    prompts: int
    new_tokens: int
    tau: float  # mean tokens kept per verification forward (drafted prefix + bonus, cut at the end)
    rounds: int  # verification forwards
    rejected_rounds: int  # rounds that refused a draft (on a hybrid target, each one rolled the state back)
    speculative_tok_per_s: float
    greedy_tok_per_s: float
    identical_to_greedy: bool
    mismatched_prompts: list[int]

    def lines(self) -> list[str]:
        speedup = self.speculative_tok_per_s / self.greedy_tok_per_s if self.greedy_tok_per_s else 0.0
        return [
            f"Prompts: {self.prompts}, new tokens: {self.new_tokens}",
            f"Acceptance length tau: {self.tau:.3f} ({self.rounds} rounds, {self.rejected_rounds} with a rejected "
            f"draft)",
            f"Speculative: {self.speculative_tok_per_s:.1f} tok/s; greedy: {self.greedy_tok_per_s:.1f} tok/s "
            f"({speedup:.2f}x)",
            "Output identical to greedy decoding: " + ("yes" if self.identical_to_greedy
                                                       else f"NO (prompts {self.mismatched_prompts})"),
        ]


def evaluate(*, target: str | Path, drafter_dir: str | Path, prompts: str | Path, max_new_tokens: int = 128,
             device: str = "auto", dtype: str = "auto") -> EvalReport:
    from trainer.checkpoint import load_drafter

    chats = read_prompts(prompts)
    torch_device = pick_device(device)
    model, tokenizer = load_target_for_generation(target, torch_device, dtype)
    drafter = load_drafter(Path(drafter_dir), embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings(), device=torch_device).eval()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    spec_runs, greedy_runs = [], []
    try:
        for messages in chats:
            prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = tokenizer(prompt_ids, add_special_tokens=False)["input_ids"]
            greedy_runs.append(greedy_decode(model, prompt_ids, max_new_tokens=max_new_tokens, eos_ids=eos_ids))
            spec_runs.append(speculative_decode(model, drafter, taps, prompt_ids, max_new_tokens=max_new_tokens,
                                                eos_ids=eos_ids))
    finally:
        taps.remove()
    rounds = [n for run in spec_runs for n in run.accepted_per_round]
    new_tokens = sum(len(run.tokens) for run in spec_runs)
    mismatched = [i for i, (a, b) in enumerate(zip(spec_runs, greedy_runs)) if a.tokens != b.tokens]
    return EvalReport(
        prompts=len(chats), new_tokens=new_tokens, tau=sum(rounds) / len(rounds) if rounds else 0.0,
        rounds=len(rounds), rejected_rounds=sum(run.rejected_rounds for run in spec_runs),
        speculative_tok_per_s=new_tokens / max(1e-9, sum(run.seconds for run in spec_runs)),
        greedy_tok_per_s=sum(len(r.tokens) for r in greedy_runs) / max(1e-9, sum(r.seconds for r in greedy_runs)),
        identical_to_greedy=not mismatched, mismatched_prompts=mismatched)
