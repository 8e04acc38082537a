"""What tau_tree_heldout adds to a held-out evaluation: the same replay timed with and without tree budgets.

A held-out evaluation (trainer/training/tau_monitor.py) runs the target over the samples, one no-grad drafter pass
over every anchor, and walks the rounds. Tree τ adds two things: each slot's best `max(budgets)` log-probabilities
in that pass (a log-softmax and a top-k over the vocabulary per drafted slot), and on the host one best-first tree
per visited anchor per budget. This times both parts on a tiny CPU target over random text with an untrained
drafter: about one round per token, the most rounds (so the most trees) a text can ask for. Times are the
process's CPU time on one thread (a shared machine's load does not inflate them).

    python bench/bench_tree_replay.py                             # 8 samples x 512 answer tokens, budgets 8,32,64
    python bench/bench_tree_replay.py --samples 32 --answer 1024  # eval_samples' default count (slow on a CPU)

Prints one JSON object: seconds per evaluation without trees, with trees, the added seconds split into the
drafter pass's top-k and the host's trees, rounds per budget, microseconds per tree round, and from those the
host's seconds for 32 samples of 1024 answer tokens at τ 1 (this text) and at τ 3 (a trained drafter's trees).
The top-k's cost at a real vocabulary is a GPU figure this CPU run does not give (README estimates it).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.model.drafter import DFlashDrafter, DrafterConfig  # noqa: E402
from trainer.model.target import TargetModel  # noqa: E402
from trainer.model.tiny_target import write_tiny_target  # noqa: E402
from trainer.training.tau_replay import anchor_pass, chain_tally  # noqa: E402
from trainer.training.tree_replay import tree_tallies  # noqa: E402

EVAL_BATCH = 4  # held-out sequences per target forward, as the monitor takes them


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8, help="held-out samples")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per sample")
    parser.add_argument("--answer", type=int, default=512, help="supervised answer tokens per sample")
    parser.add_argument("--budgets", default="8,32,64", help="node budgets (eval_tree_budgets)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=256, help="anchors per sequence per drafter forward")
    parser.add_argument("--repeat", type=int, default=2, help="timed evaluations of each kind (the best is kept)")
    return parser.parse_args(argv)


def build(block_size: int, length: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = write_tiny_target(Path(tempfile.mkdtemp()) / "target", seed=0, max_position_embeddings=length + 64)
    model = AutoModelForCausalLM.from_pretrained(str(root), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(root))
    target = TargetModel(model, layer_ids=[1, 3], mask_token_id=tokenizer.mask_token_id, tokenizer=tokenizer)
    config = DrafterConfig.from_target(model.config, num_layers=1, block_size=block_size, target_layer_ids=[1, 3],
                                       mask_token_id=tokenizer.mask_token_id)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head).eval()
    return target, drafter.requires_grad_(False), model.config.vocab_size


@torch.no_grad()
def evaluate(target, drafter, groups, *, width: int, budgets: list[int]) -> dict:
    """One held-out evaluation as the monitor runs it; seconds of each part."""
    seconds = {"target": 0.0, "pass": 0.0, "chain": 0.0, "trees": 0.0}
    rounds, per_budget = dict.fromkeys(budgets, 0), dict.fromkeys(budgets, 0.0)
    for input_ids, loss_mask in groups:
        started = time.process_time()
        features = target.features(input_ids)
        passed = time.process_time()
        found = anchor_pass(drafter, features, input_ids, loss_mask, width=width, top=max(budgets, default=0))
        walked = time.process_time()
        chain_tally(found.streaks, loss_mask, drafter.config.block_size)
        chained = time.process_time()
        for budget in budgets:
            began = time.process_time()
            rounds[budget] += tree_tallies(found, input_ids, loss_mask, [budget])[budget].rounds
            per_budget[budget] += time.process_time() - began
        done = time.process_time()
        for name, value in zip(seconds, (passed - started, walked - passed, chained - walked, done - chained)):
            seconds[name] += value
    return {"seconds": seconds, "rounds": rounds, "per_budget": per_budget}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core of a shared machine, as the trainer's CPU tests run
    budgets = [int(part) for part in args.budgets.split(",") if part.strip()]
    length = args.prompt + args.answer
    target, drafter, vocab = build(args.block_size, length)
    generator = torch.Generator().manual_seed(0)
    groups = []
    for first in range(0, args.samples, EVAL_BATCH):
        count = min(EVAL_BATCH, args.samples - first)
        input_ids = torch.randint(0, vocab, (count, length), generator=generator)
        loss_mask = torch.zeros(count, length, dtype=torch.bool)
        loss_mask[:, args.prompt:] = True
        groups.append((input_ids, loss_mask))
    runs = {"chain": [], "trees": []}
    for _ in range(args.repeat):
        runs["chain"].append(evaluate(target, drafter, groups, width=args.width, budgets=[]))
        runs["trees"].append(evaluate(target, drafter, groups, width=args.width, budgets=budgets))
    best = {kind: min(results, key=lambda r: sum(r["seconds"].values())) for kind, results in runs.items()}
    chain_s, trees_s = (sum(best[kind]["seconds"].values()) for kind in ("chain", "trees"))
    tree_rounds = best["trees"]["rounds"]
    per_round = {budget: 1e6 * best["trees"]["per_budget"][budget] / max(1, tree_rounds[budget]) for budget in budgets}
    report = {
        "samples": args.samples, "answer_tokens": args.answer, "budgets": budgets, "vocab": vocab,
        "block_size": args.block_size, "threads": torch.get_num_threads(),
        "evaluation_s_chain_only": round(chain_s, 3), "evaluation_s_with_trees": round(trees_s, 3),
        "added_s": round(trees_s - chain_s, 3),
        "added_s_topk_in_pass": round(best["trees"]["seconds"]["pass"] - best["chain"]["seconds"]["pass"], 3),
        "added_s_host_trees": round(best["trees"]["seconds"]["trees"], 3),
        "tree_rounds": tree_rounds,
        "us_per_tree_round": {budget: round(us, 1) for budget, us in per_round.items()},
        "host_s_estimate_32x1024": {f"tau_{tau}": round(32 * 1024 / tau * sum(per_round.values()) / 1e6, 2)
                                    for tau in (1, 3)},
        "parts_s_with_trees": {name: round(value, 3) for name, value in best["trees"]["seconds"].items()},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
