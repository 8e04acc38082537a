"""DFlash2 against DFlash on bench_tau's structured target, at the same steps and at the same wall time.

bench_tau.py's stages build the target (a Qwen3-shaped LM trained on standard-library source), its own answers
and the held-out split once; then each architecture trains a drafter for the same number of steps (block 8, the
DFlash2 recipe, for both), and the faster one trains again for as many steps as fit the slower one's wall time.
Every drafter is measured the same way: the held-out τ its run replays (tau_heldout, decoded chain: DFlash2's
selector path) and `trainer eval` on held-out prompts, its chain and its DDTree trees at each --tree-budget.

    python bench/bench_dflash2.py --device cuda       # one H200
    python bench/bench_dflash2.py --tiny               # a CPU smoke run of every stage

Any bench_tau.py option applies too (--drafter-steps, --lm-seconds, ...). One JSON object on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import bench_tau  # bench/ is on sys.path when one of its scripts runs
from bench_tau import say

ARCHITECTURES = ("dflash", "dflash2")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     add_help=False)
    parser.add_argument("--tree-budgets", default="8,32,64", help="DDTree node budgets `trainer eval` decodes")
    parser.add_argument("--block-size", type=int, default=8, help="slots per block of both drafters")
    ours, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print("\nbench_tau.py's options:")
    args = bench_tau.parse_args(rest)
    args.tree_budgets = [int(n) for n in ours.tree_budgets.split(",") if n]
    args.block_size = ours.block_size
    return args


def train_drafter(work: Path, args, architecture: str, steps: int) -> tuple[str, dict]:
    """One drafter run of `architecture` for `steps` steps: its output directory's name and its figures."""
    import yaml

    name = f"drafter-{architecture}-{steps}"
    config = bench_tau.drafter_config(work, args) | {
        "architecture": architecture, "output_dir": str(work / name), "max_steps": steps,
        "log_every": max(1, steps // 20), "eval_every": max(1, steps // 5)}
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    began = time.perf_counter()
    bench_tau.trainer_process("train", "--config", str(work / f"{name}.yaml"), log=work / f"{name}.log")
    figures = bench_tau.training_figures(work, name) | {"seconds": round(time.perf_counter() - began, 1)}
    say(f"{name}: {figures}")
    return name, figures


def evaluate_drafter(work: Path, args, name: str, steps: int) -> dict:
    """`trainer eval` of the drafter on the held-out prompts: the chain's τ and each tree budget's."""
    from trainer.decoding.evaluation import evaluate

    report = evaluate(target=work / "target", drafter_dir=work / name / f"step_{steps}",
                      prompts=work / "heldout_prompts.jsonl", max_new_tokens=args.max_new_tokens, device=args.device,
                      dtype=args.eval_dtype, tree_budgets=args.tree_budgets, baseline=False)
    runs = [report.drafter, *report.trees]
    return {"chain_tau": round(report.tau, 4), "tree_tau": {t.budget: round(t.tau, 4) for t in report.trees},
            "identical_to_greedy": all(run.identical_to_greedy for run in runs)}


def measured(work: Path, args, architecture: str, steps: int) -> dict:
    name, figures = train_drafter(work, args, architecture, steps)
    return {"steps": steps, "train_seconds": figures["seconds"], "loss": figures["loss"],
            "tau_heldout": figures["tau_heldout"], "eval": evaluate_drafter(work, args, name, steps)}


def run(work: Path, args) -> dict:
    import random

    import torch

    began = time.perf_counter()
    snippets = bench_tau.code_snippets(max_bytes=int(args.corpus_mb * 1e6), lines_per_snippet=16)
    random.Random(0).shuffle(snippets)
    cut = int(len(snippets) * 0.8)
    target = bench_tau.train_target(work / "target", snippets[:cut], args, torch.device(args.device))
    data = bench_tau.prepare_data(work, snippets[cut:], args)
    count = bench_tau.heldout_prompts(work / "chats.jsonl", work / "heldout_prompts.jsonl", share=args.heldout,
                                      count=args.eval_prompts)
    same_steps = {arch: measured(work, args, arch, args.drafter_steps) for arch in ARCHITECTURES}
    # the same wall time: the faster architecture trains again, for as many steps as the slower one's time buys
    slower = max(ARCHITECTURES, key=lambda arch: same_steps[arch]["train_seconds"])
    faster = next(arch for arch in ARCHITECTURES if arch != slower)
    ratio = same_steps[slower]["train_seconds"] / max(same_steps[faster]["train_seconds"], 1e-9)
    longer = max(args.drafter_steps, round(args.drafter_steps * ratio))
    same_time = {slower: same_steps[slower], faster: measured(work, args, faster, longer)}
    return {"device": args.device, "size": args.size, "block_size": args.block_size, "target": target, "data": data,
            "heldout_prompts": count, "tree_budgets": args.tree_budgets, "same_steps": same_steps,
            "same_wall_time": same_time, "wall_time_ratio": round(ratio, 3),
            "seconds": round(time.perf_counter() - began, 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench_tau.in_workdir(args.workdir, "bench_dflash2-", lambda work: run(work, args))
    print(json.dumps(result, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
