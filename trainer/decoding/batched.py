"""Greedy, chain and tree decoding of many prompts at once, over one KV cache the target keeps for the whole run.

Each prompt is a row. The prompts are prefilled once, left-padded into one batch; every round then feeds each
row one draft tree (greedy: the anchor alone; DFlash: a chain; DDTree: a best-first tree) of the same node count
and verifies all rows in one target forward. Rows accept different numbers of tokens, so the cache is never
cropped: it grows by one slot per fed node, and a per-row validity mask hides the slots of refused nodes (and of
the padding) from every later query. The additive 4D mask a round passes to the target is [that validity | the
tree's ancestor-only mask], with each node at position anchor + depth: a node sees exactly the accepted text and
its own path, as one-token steps would. A row leaves the batch when it is done.

A hybrid target's linear-attention layers keep one recurrent state per row, which a masked slot cannot undo:
after each verify pass those states are rewound, row by row, to the accepted tokens
(trainer/decoding/linear_state_rollback.py). That works for chains, not trees (a tree's branches would pass through
one state), so hybrids decode greedy and chains here.
Targets with sliding-window layers (a window the custom mask would not apply) decode one prompt at a
time (trainer/decoding/speculative.py).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from trainer.decoding.draft_tree import DraftTree, best_first, best_first_paired, chain, tree_layout
from trainer.decoding.linear_state_rollback import LinearStates
from trainer.decoding.speculative import (Decoded, DecodeRun, LayerTaps, Top, cache_argument, finish,
                                          has_recurrent_state, top_logits_rows)

COMPACT_MIN_SLOTS = 32  # hidden slots tolerated before the cache is compacted


@dataclass
class RoundInput:
    """What a proposer sees of the rows in flight: it returns one tree per row, all of one size."""

    features: torch.Tensor  # [A, S, k*H] tapped target states by position (valid before each anchor)
    anchors: torch.Tensor  # [A] the last accepted token of each row
    positions: torch.Tensor  # [A] its position
    prompts: list[int]  # which prompt each row decodes


Propose = Callable[[RoundInput], list[DraftTree]]


def can_batch(model) -> bool:
    """True when the masked shared cache is exact for this target's chains (no sliding window)."""
    layer_types = getattr(model.config, "layer_types", None) or ()
    return "sliding_attention" not in layer_types and not getattr(model.config, "use_sliding_window", False)


def can_batch_trees(model) -> bool:
    """True when a tree can be verified in one target forward: batched, and no recurrent state to share."""
    return can_batch(model) and not has_recurrent_state(model)


def greedy_proposer() -> Propose:
    return lambda round_input: [chain(int(a), []) for a in round_input.anchors.tolist()]


def block_hidden(drafter, round_input: RoundInput) -> torch.Tensor:
    """[A, B, H] final hidden states of one block per row; each row's context is its features before its anchor."""
    positions = round_input.positions
    context = round_input.features[:, :int(positions.max())].to(drafter.fc.weight.dtype)
    return drafter(context, round_input.anchors[:, None], positions[:, None], backend="sdpa")[:, 0]


def chain_proposer(drafter) -> Propose:
    """The drafter's chain: each slot's top-1 (DFlash), the selector's path (DFlash2)."""
    def propose(round_input: RoundInput) -> list[DraftTree]:
        drafts = drafter.chain(block_hidden(drafter, round_input), round_input.anchors).tolist()
        return [chain(int(a), d) for a, d in zip(round_input.anchors.tolist(), drafts)]
    return propose


def tree_proposer(drafter, budget: int) -> Propose:
    """DDTree: DFlash's from each slot's distribution; DFlash2's from the selector's candidates, each child scored
    after its parent (draft_tree.best_first_paired)."""
    def propose(round_input: RoundInput) -> list[DraftTree]:
        hidden = block_hidden(drafter, round_input)[:, 1:]
        logits = drafter.lm_head(hidden.to(drafter.lm_head.weight.dtype)).float()
        anchors = round_input.anchors.tolist()
        if getattr(drafter, "selector_top_k", None):
            candidates, first, later = drafter.candidate_logprobs(logits, hidden, round_input.anchors)
            return [best_first_paired(a, f, lt, c, budget) for a, f, lt, c in zip(
                anchors, first.tolist(), later.tolist(), candidates.tolist())]
        logprobs, ids = torch.log_softmax(logits, dim=-1).topk(min(budget, logits.shape[-1]), dim=-1)
        return [best_first(a, lp, i, budget) for a, lp, i in zip(anchors, logprobs.tolist(), ids.tolist())]
    return propose


@dataclass
class _Row:
    index: int  # the prompt's place in the input
    prompt_len: int
    tokens: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    rejected: int = 0
    top: list[tuple[list[float], list[int]]] = field(default_factory=list)
    done: bool = False

    def anchor_pos(self) -> int:
        return self.prompt_len + len(self.tokens) - 1


class _Batch:
    """The rows still decoding and what the target and the drafter need of them."""

    def __init__(self, model, taps: LayerTaps, prompts: list[list[int]], *, extra_positions: int):
        from transformers import DynamicCache

        self.model, self.taps = model, taps
        self.rows = [_Row(index=i, prompt_len=len(p)) for i, p in enumerate(prompts)]
        recurrent = has_recurrent_state(model)
        # a hybrid's cache needs the config to give its linear-attention layers their state slots
        self.cache = DynamicCache(config=model.config) if recurrent else DynamicCache()
        self.linear = LinearStates(model, self.cache) if recurrent else None
        width = max(map(len, prompts))
        device = model.device
        self.valid = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
        positions = torch.zeros_like(ids)
        for r, prompt in enumerate(prompts):
            pad = width - len(prompt)
            ids[r, pad:] = torch.tensor(prompt, device=device)
            positions[r, pad:] = torch.arange(len(prompt), device=device)
            self.valid[r, pad:] = True
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        # a linear-attention layer is told the padding too: zeroed, left padding leaves its state at zero
        logits = self.forward(ids, positions, self.valid[:, None, :] & causal, old=0, padding=self.valid)
        states = taps.features()
        self.features = states.new_zeros(len(prompts), width + extra_positions, states.shape[-1])
        for r, prompt in enumerate(prompts):
            self.features[r, :len(prompt)] = states[r, width - len(prompt):]
        self.last_logits = logits[:, -1]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, new_mask: torch.Tensor, *, old: int,
                padding: torch.Tensor | None = None):
        """Logits [A, n, V] of n new slots; new_mask [A, n, n] says which new slots each new one may see (itself
        included: a row never attends to nothing), the validity mask which of the `old` cached ones; padding
        [A, n]: the real new slots, where some are not."""
        seen = torch.cat([self.valid[:, None, :old].expand(-1, ids.shape[1], -1), new_mask], dim=-1)
        additive = torch.zeros(seen.shape, dtype=self.model.dtype, device=ids.device)
        additive.masked_fill_(~seen, torch.finfo(self.model.dtype).min)
        mask = additive[:, None]
        if self.linear is not None:  # each layer type takes its own mask
            mask = {"full_attention": mask, "linear_attention": padding}
        kwargs = {cache_argument(self.model): self.cache}
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                          **kwargs).logits

    def verifying(self):
        """Around a verify forward: a hybrid's linear-attention states kept aside to rewind (else nothing)."""
        return self.linear.verifying() if self.linear is not None else nullcontext()

    def compact(self) -> None:
        """Drop the slots no row can see any more (refused nodes, padding) once they are worth a gather: each
        row's visible slots move to the front, in order; positions travel with them, so nothing else changes."""
        counts = self.valid.sum(dim=1)
        width = int(counts.max())
        if self.valid.shape[1] - width < max(COMPACT_MIN_SLOTS, width // 4):
            return
        length = self.valid.shape[1]
        slots = torch.arange(length, device=counts.device)
        order = (slots + length * (~self.valid)).sort(dim=1).indices[:, :width]  # visible ones first, in order
        for layer in self._attention_layers():
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        self.valid = slots[:width] < counts[:, None]

    def _attention_layers(self) -> list:
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None]

    def keep(self, alive: list[int]) -> None:
        index = torch.tensor(alive, device=self.valid.device)
        for layer in self._attention_layers():
            layer.batch_select_indices(index)
        if self.linear is not None:
            self.linear.select_rows(index)
        self.valid, self.features = self.valid[index], self.features[index]
        self.rows = [self.rows[i] for i in alive]


def _emit(row: _Row, tokens: list[int], tops: list[Top], *, max_new_tokens: int, eos_ids: set[int]) -> None:
    """Append the tokens the round accepted, cut at max_new_tokens / an end token; tops: the target's best logits
    at the places that chose them, when recorded (else empty)."""
    kept_before = len(row.tokens)
    row.tokens, row.done = finish(row.tokens + tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    kept = len(row.tokens) - kept_before
    row.top += tops[:kept]
    if kept_before:  # the prefill's token is no round's
        row.rounds.append(kept)


def _round(batch: _Batch, propose: Propose, record_top: bool, *, max_new_tokens: int, eos_ids: set[int]) -> None:
    device = batch.valid.device
    anchors = torch.tensor([row.tokens[-1] for row in batch.rows], device=device)
    positions = torch.tensor([row.anchor_pos() for row in batch.rows], device=device)
    trees = propose(RoundInput(batch.features, anchors, positions, [row.index for row in batch.rows]))
    depths, ancestors = tree_layout(torch.tensor([tree.parents for tree in trees], device=device))
    ids = torch.tensor([tree.tokens for tree in trees], device=device)
    old = batch.valid.shape[1]
    with batch.verifying() as verified:
        logits = batch.forward(ids, positions[:, None] + depths, ancestors, old=old)
    choices = logits.argmax(dim=-1).tolist()
    width = ids.shape[1]
    tops = top_logits_rows(logits.flatten(0, 1)) if record_top else None  # row r's node n at r * width + n
    accepted = [tree.accept(choice) for tree, choice in zip(trees, choices)]
    kept = [[0, *path] for path, _ in accepted]  # each row's anchor and accepted nodes, in order
    # one index for every row's kept nodes (row, node, position): two kernels and one copy per round, where a
    # loop over rows paid a host-to-device copy and a sync per row
    where = torch.tensor([(r, n, row.anchor_pos() + depth) for r, (row, nodes) in enumerate(zip(batch.rows, kept))
                          for depth, n in enumerate(nodes)], device=device).T
    new_valid = torch.zeros(len(trees), width, dtype=torch.bool, device=device)
    new_valid[where[0], where[1]] = True
    batch.features[where[0], where[2]] = batch.taps.features()[where[0], where[1]]
    if verified is not None:  # a chain's kept nodes are its first ones: each row keeps that many fed positions
        verified.rewind(torch.tensor([len(nodes) for nodes in kept], device=device))
    for r, (row, tree, (path, bonus), nodes) in enumerate(zip(batch.rows, trees, accepted, kept)):
        row.rejected += any(parent == nodes[-1] for parent in tree.parents)
        _emit(row, [tree.tokens[n] for n in path] + [bonus], [tops[r * width + n] for n in nodes] if tops else [],
              max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    batch.valid = torch.cat([batch.valid, new_valid], dim=1)
    batch.compact()


@torch.no_grad()
def decode_batch(model, taps: LayerTaps, prompts: list[list[int]], propose: Propose, *, max_new_tokens: int,
                 eos_ids: set[int], extra_positions: int, record_top: bool = False) -> DecodeRun:
    """Decode every prompt (one Decoded each, in order; `seconds` is the whole batch's). `extra_positions`: the
    most a round may reach past max_new_tokens (the tree's depth); `record_top` keeps the target's best logits for
    every emitted token (a greedy reference's)."""
    started = time.perf_counter()
    batch = _Batch(model, taps, prompts, extra_positions=max_new_tokens + extra_positions + 1)
    finished: list[_Row] = []
    firsts = batch.last_logits.argmax(dim=-1).tolist()
    tops = top_logits_rows(batch.last_logits) if record_top else None
    for r, row in enumerate(batch.rows):
        _emit(row, [firsts[r]], [tops[r]] if tops else [], max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    while batch.rows:
        if any(row.done for row in batch.rows):
            finished += [row for row in batch.rows if row.done]
            alive = [r for r, row in enumerate(batch.rows) if not row.done]
            if not alive:
                break
            batch.keep(alive)
        _round(batch, propose, record_top, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    seconds = time.perf_counter() - started
    finished.sort(key=lambda row: row.index)
    return DecodeRun(outputs=[Decoded(tokens=row.tokens, seconds=seconds, accepted_per_round=row.rounds,
                                      rejected_rounds=row.rejected, top=row.top) for row in finished],
                     seconds=seconds)
