"""The τ figures a training run reports next to streak: replayed rounds on the logged step's own batch
(`tau_replay`), and every `eval_every` steps the same replay on the held-out split that `prepare` set aside
(`tau_heldout`), DDTree's tree rounds replayed there at the eval's node budgets from the same drafter pass
(`tau_tree_heldout`), optionally with real speculative decoding of a few held-out prompts (`tau_eval`).

Training-batch replay runs on every rank and is summed over ranks (one small all-reduce, on logged steps
only); the held-out evaluation runs on rank 0 alone while the other ranks wait at the next collective.
"""
from __future__ import annotations

import numpy as np
import torch

from trainer.errors import TrainerError
from trainer.planning.preflight import heldout_dir, heldout_problem
from trainer.training.tau_replay import ReplayTally, anchor_pass, chain_tally, replay_batch
from trainer.training.tree_replay import tree_tallies

EVAL_BATCH = 4           # held-out sequences per target forward


def open_heldout(cfg):
    """The held-out TokenDataset when eval_every asks for one (preflight checked that it is there)."""
    from trainer.data import batches as data_lib

    if not cfg.eval_every:
        return None
    problem = heldout_problem(cfg)
    if problem is not None:
        raise TrainerError(str(problem))
    return data_lib.open_dataset(heldout_dir(cfg))


def first_supervised(mask: np.ndarray) -> int:
    supervised = np.flatnonzero(mask)
    return int(supervised[0]) if len(supervised) else len(mask)


class TauMonitor:
    """What train.py calls on logged steps: `measure` gives the τ fields of that step's line."""

    def __init__(self, cfg, ctx, target, drafter, *, autocast, width: int):
        self.cfg, self.ctx, self.target, self.drafter = cfg, ctx, target, drafter
        self.autocast, self.width = autocast, width
        self.heldout = open_heldout(cfg) if ctx.is_main else None
        self.block_size = drafter.config.block_size

    def eval_due(self, step: int) -> bool:
        return bool(self.cfg.eval_every) and step % self.cfg.eval_every == 0

    def measure(self, step: int, features, input_ids, loss_mask, *, last: bool = False) -> dict:
        """The τ fields of a logged step: keys that a step line and metrics.jsonl carry when measured."""
        out: dict = {}
        if self.cfg.replay_sequences:
            with self.autocast:
                tally = replay_batch(self.drafter, features, input_ids, loss_mask,
                                     max_sequences=self.cfg.replay_sequences, width=self.width)
            tally = self._summed(tally)
            out.update(tau_replay=tally.tau, accept_hist=tally.shares())
        if self.ctx.is_main and self.heldout is not None and (self.eval_due(step) or last):
            held, trees = self.heldout_tallies()
            out.update(tau_heldout=held.tau, accept_hist_heldout=held.shares())
            tree_taus = {budget: tally.tau for budget, tally in trees.items() if tally.tau is not None}
            out.update(tau_tree_heldout=tree_taus or None)
            if self.cfg.eval_prompts:
                out.update(self.decode_heldout())
        return {key: value for key, value in out.items() if value is not None}

    def _summed(self, tally: ReplayTally) -> ReplayTally:
        if not self.ctx.is_distributed:
            return tally
        import torch.distributed as dist

        tensor = tally.as_tensor(self.block_size, self.ctx.device)
        dist.all_reduce(tensor)
        return ReplayTally.from_tensor(tensor)

    def _samples(self, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        count = min(count, len(self.heldout))
        ids, masks = self.heldout.rows(np.arange(count))
        limit = self.cfg.max_length
        return [(row[:limit].astype(np.int64), mask[:limit].astype(bool)) for row, mask in zip(ids, masks)]

    @torch.no_grad()
    def heldout_tallies(self) -> tuple[ReplayTally, dict[int, ReplayTally]]:
        """Replayed chain rounds over the first eval_samples held-out samples (one target forward per few), and
        the tree rounds per eval_tree_budgets budget from the same drafter pass."""
        from trainer.model.drafter import unwrap

        inner = unwrap(self.drafter)
        budgets = list(self.cfg.eval_tree_budgets)
        tally = ReplayTally(hist=[0] * self.block_size)
        trees = {budget: ReplayTally() for budget in budgets}
        samples = self._samples(self.cfg.eval_samples)
        device = self.ctx.device
        for first in range(0, len(samples), EVAL_BATCH):
            group = samples[first:first + EVAL_BATCH]
            width = max(len(ids) for ids, _ in group)
            input_ids = torch.zeros(len(group), width, dtype=torch.long)
            loss_mask = torch.zeros(len(group), width, dtype=torch.bool)
            attention = torch.zeros(len(group), width, dtype=torch.long)
            for row, (ids, mask) in enumerate(group):
                input_ids[row, :len(ids)] = torch.from_numpy(ids)
                loss_mask[row, :len(mask)] = torch.from_numpy(mask)
                attention[row, :len(ids)] = 1
            with self.autocast:
                features = self.target.features(input_ids, attention)
                input_ids, loss_mask = input_ids.to(device), loss_mask.to(device)
                found = anchor_pass(inner, features, input_ids, loss_mask, width=max(1, self.width),
                                    top=max(budgets, default=0))
            tally = tally.add(chain_tally(found.streaks, loss_mask, self.block_size))
            for budget, part in tree_tallies(found, input_ids, loss_mask, budgets).items():
                trees[budget] = trees[budget].add(part)
        return tally, trees

    def decode_heldout(self) -> dict:
        """Real speculative decoding of the first eval_prompts held-out prompts: EVAL_BATCH at a time over one
        cache (trainer/decoding/batched.py), or one by one where the target cannot batch
        (trainer/decoding/speculative.py)."""
        from trainer.decoding.batched import can_batch, chain_proposer, decode_batch
        from trainer.decoding.speculative import LayerTaps, speculative_decode
        from trainer.model.drafter import unwrap

        inner = unwrap(self.drafter)
        model = self.target.hf_model
        tokenizer = self.target.tokenizer
        eos = {tokenizer.eos_token_id} if tokenizer is not None and tokenizer.eos_token_id is not None else set()
        prompts = [ids[:first_supervised(mask)].tolist() for ids, mask in self._samples(self.cfg.eval_prompts)]
        prompts = [prompt for prompt in prompts if prompt]
        new_tokens = self.cfg.eval_max_new_tokens
        rounds: list[int] = []
        taps = LayerTaps(model, inner.config.target_layer_ids)
        try:
            if can_batch(model):
                for first in range(0, len(prompts), EVAL_BATCH):
                    run = decode_batch(model, taps, prompts[first:first + EVAL_BATCH], chain_proposer(inner),
                                       max_new_tokens=new_tokens, eos_ids=eos, extra_positions=self.block_size)
                    rounds += run.rounds
            else:
                for prompt in prompts:
                    rounds += speculative_decode(model, inner, taps, prompt, max_new_tokens=new_tokens,
                                                 eos_ids=eos).accepted_per_round
        finally:
            taps.remove()
        return {"tau_eval": sum(rounds) / len(rounds) if rounds else None, "eval_rounds": len(rounds)}
