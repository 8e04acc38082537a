"""`python -m trainer eval`: speculative decoding with a trained drafter, measured against greedy decoding of the
same target, beside an untrained drafter of the same shape and the drafter's DDTree trees.

One target load serves every run: greedy (the reference, and the logits that judge a divergence), the drafter's
chain, the baseline's chain, and one tree per budget. Prompts decode many at once over one cache
(trainer/decoding/batched.py), a hybrid's linear-attention states rewound row by row after each verify pass; hybrids
refuse trees (a tree's branches would share one recurrent state, so it cannot be verified in one pass).
Sliding-window targets decode one prompt at a time with exact cache rollback (trainer/decoding/speculative.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from trainer.data.generate import load_target_for_generation, pick_device, read_prompts
from trainer.decoding.batched import (can_batch, can_batch_trees, chain_proposer, decode_batch, greedy_proposer,
                                      tree_proposer)
from trainer.decoding.eval_report import EvalReport, rounding_epsilon, summarize
from trainer.decoding.speculative import DecodeRun, LayerTaps, greedy_decode, speculative_decode
from trainer.errors import TrainerError
from trainer.model.cpu_threads import one_thread_for_a_small_model
from trainer.model.target import check_target_dir, linear_attention_kernel

BASELINE_SEED = 0
def untrained_like(drafter):
    """A drafter of the same shape, freshly initialised (fixed seed), on the same device and dtype."""
    from trainer.model.drafter import DFlashDrafter

    weight = drafter.fc.weight
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BASELINE_SEED)
        baseline = DFlashDrafter(drafter.config, embed_tokens=drafter.embed_tokens, lm_head=drafter.lm_head)
    return baseline.to(device=weight.device, dtype=weight.dtype).eval()


class _Runner:
    """Decodes every prompt one way and times it: in batches where the target allows, else one by one."""

    def __init__(self, model, taps: LayerTaps, prompt_ids: list[list[int]], *, max_new_tokens: int,
                 eos_ids: set[int], batch_size: int):
        self.model, self.taps, self.prompt_ids = model, taps, prompt_ids
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        self.batch_size = batch_size if can_batch(model) else 1

    def greedy(self) -> DecodeRun:
        if self.batch_size == 1:
            return self._one_by_one(lambda ids: greedy_decode(self.model, ids, max_new_tokens=self.max_new_tokens,
                                                              eos_ids=self.eos_ids, record_top=True))
        return self._batched(greedy_proposer(), extra=0, record_top=True)

    def chain(self, drafter) -> DecodeRun:
        if self.batch_size == 1:
            return self._one_by_one(lambda ids: speculative_decode(
                self.model, drafter, self.taps, ids, max_new_tokens=self.max_new_tokens, eos_ids=self.eos_ids))
        return self._batched(chain_proposer(drafter), extra=drafter.config.block_size)

    def tree(self, drafter, budget: int) -> DecodeRun:
        return self._batched(tree_proposer(drafter, budget), extra=drafter.config.block_size)

    def _one_by_one(self, decode) -> DecodeRun:
        outputs = [decode(ids) for ids in self.prompt_ids]
        return DecodeRun(outputs=outputs, seconds=sum(out.seconds for out in outputs))

    def _batched(self, propose, *, extra: int, record_top: bool = False) -> DecodeRun:
        outputs, seconds = [], 0.0
        for start in range(0, len(self.prompt_ids), self.batch_size):
            part = decode_batch(self.model, self.taps, self.prompt_ids[start:start + self.batch_size], propose,
                                max_new_tokens=self.max_new_tokens, eos_ids=self.eos_ids, extra_positions=extra,
                                record_top=record_top)
            outputs += part.outputs
            seconds += part.seconds
        return DecodeRun(outputs=outputs, seconds=seconds)


def _tokenize(tokenizer, chats) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) for messages in chats]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def evaluate(*, target: str | Path, drafter_dir: str | Path, prompts: str | Path, max_new_tokens: int = 128,
             device: str = "auto", dtype: str = "auto", tree_budgets: list[int] | tuple[int, ...] = (),
             baseline: bool = True, batch_size: int = 64, say=_say) -> EvalReport:
    from trainer.model.drafter_files import load_drafter

    chats = read_prompts(prompts)
    torch_device = pick_device(device)
    model, tokenizer = load_target_for_generation(target, torch_device, dtype)
    one_thread_for_a_small_model(model.config.hidden_size, torch_device, say, command="eval")
    tf32_dots = (model.dtype == torch.float32 and torch_device.type == "cuda"
                 and linear_attention_kernel(check_target_dir(Path(target))) == "fla")
    epsilon = rounding_epsilon(model.dtype, tf32_dots=tf32_dots)
    if tree_budgets and not can_batch_trees(model):
        raise TrainerError(f"--tree-budget: {model.config.model_type} has linear-attention or sliding-window "
                           "layers, so a tree cannot be verified in one target forward; evaluate chains only")
    drafter = load_drafter(Path(drafter_dir), embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings(), device=torch_device).eval()
    taps = LayerTaps(model, drafter.config.target_layer_ids)
    runner = _Runner(model, taps, _tokenize(tokenizer, chats), max_new_tokens=max_new_tokens,
                     eos_ids={tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set(),
                     batch_size=max(1, batch_size))
    planned = [("drafter", None, lambda: runner.chain(drafter))]
    if baseline:
        untrained = untrained_like(drafter)
        planned.append(("baseline", None, lambda: runner.chain(untrained)))
    planned += [(f"drafter tree {n}", n, lambda n=n: runner.tree(drafter, n)) for n in tree_budgets]
    try:
        greedy = runner.greedy()
        say(f"eval: greedy {greedy.new_tokens} tokens in {greedy.seconds:.1f}s")
        summaries = []
        for name, budget, run in planned:
            decoded = run()
            summaries.append(summarize(name, decoded, greedy, epsilon=epsilon,
                                       block_size=drafter.config.block_size, budget=budget))
            say(f"eval: {name}: tau {summaries[-1].tau:.3f}, {decoded.new_tokens} tokens in {decoded.seconds:.1f}s")
    finally:
        taps.remove()
    return EvalReport(
        prompts=len(chats), max_new_tokens=max_new_tokens, dtype=str(model.dtype).removeprefix("torch."),
        device=str(torch_device), batch_size=min(runner.batch_size, len(chats)), block_size=drafter.config.block_size,
        greedy_tok_per_s=greedy.tok_per_s(), drafter=summaries[0],
        baseline=summaries[1] if baseline else None, trees=summaries[1 + baseline:], tf32_dots=tf32_dots)
