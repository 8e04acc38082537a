"""Which training objective, and which drafter architecture, gives the most acceptance? Each one trained on one
structured target, then decoded.

bench_tau's stages build the target once (a Qwen3-shaped LM trained here on standard-library Python source, its own
greedy answers prepared with a held-out split); then for each variant (config `loss:` / `slot_weights:` /
`architecture:`):
(a) `trainer train` at the same number of steps, one run after another (after an unmeasured warm-up run), so that
    each run's seconds per step (the median of its logged intervals) is measured alone on the device;
(b) `trainer train` at the same wall time: the slowest variant's time at (a), or --seconds, turned into steps
    with each variant's own seconds per step (a run within 3 % of (a)'s steps is (a)'s run);
and for every run `trainer eval --tree-budget` on held-out prompts: decoded chain τ (DFlash2: its selector's path)
and DDTree τ per budget, exact in float32. The (b) runs and the evaluations run --jobs at a time (evaluations of
(a) beside the training of (b)): their step counts are fixed already and τ does not depend on speed.

Prints one markdown table (or --json: one object with it). Everything is kept in --workdir; a second run of the
same command there reuses the target, the data and every finished run and evaluation (a run cut short starts
over), so a run stopped by a time limit continues where it stopped. Runs of another --block-size or --seed sit
beside them and share the target and the data.

    python bench/bench_objectives.py --device cuda --workdir /tmp/objectives     # one H200: about 10 minutes
    python bench/bench_objectives.py --device cuda --workdir /tmp/objectives --objectives ce,dflash2 --block-size 8
    python bench/bench_objectives.py --tiny --objectives ce,kl                  # a CPU smoke run of every stage
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_tau  # bench/ is on sys.path when one of its scripts runs; it puts the repository there too

# name: (loss, slot_weights, architecture)
VARIANTS = {
    "ce": ("ce", "decay", "dflash"),
    "ce+dpace": ("ce", "dpace", "dflash"),
    "cap": ("cap", "decay", "dflash"),
    "kl": ("kl", "decay", "dflash"),
    "lk_hybrid": ("lk_hybrid", "decay", "dflash"),
    "tv": ("tv", "decay", "dflash"),
    "nla": ("nla", "decay", "dflash"),
    "cap+dpace": ("cap", "dpace", "dflash"),
    "0.1ce+0.9cap": ({"ce": 0.1, "cap": 0.9}, "decay", "dflash"),
    "0.5ce+0.5kl": ({"ce": 0.5, "kl": 0.5}, "decay", "dflash"),
    "dflash2": ("ce", "decay", "dflash2"),
    "dflash2+dpace": ("ce", "dpace", "dflash2"),
}
DEFAULT_VARIANTS = ("ce", "ce+dpace", "cap", "kl", "lk_hybrid", "tv", "nla")
SAME_RUN_SHARE = 0.03   # (b) reuses (a) when the step counts differ by less than this


def say(message: str) -> None:
    print(f"[bench_objectives] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run at bench_tau's tiny size")
    parser.add_argument("--workdir", default=None, help="keep (and reuse) everything here (default: a temporary "
                                                        "directory)")
    parser.add_argument("--objectives", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from: {', '.join(VARIANTS)} (default: {','.join(DEFAULT_VARIANTS)}); "
                             "dflash2 is the DFlash2 architecture trained with ce")
    parser.add_argument("--block-size", type=int, default=None,
                        help="slots per block of every drafter (default bench_tau's: 16; tiny 8; DFlash2's recipe 8)")
    parser.add_argument("--seed", type=int, default=0, help="the drafters' seed (initialisation, batch order, anchors)")
    parser.add_argument("--steps", type=int, default=None, help="drafter steps at equal steps (default 400; tiny 4)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="wall-time budget of the equal-time runs (default: the slowest objective's time at "
                             "equal steps)")
    parser.add_argument("--jobs", type=int, default=None, help="equal-time runs and evaluations run at once "
                                                               "(default 6 on a GPU, 1 on the CPU)")
    parser.add_argument("--tree-budgets", default="8,32,64", help="DDTree node budgets of trainer eval")
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts decoded (default 48)")
    parser.add_argument("--lm-seconds", type=float, default=None, help="the target LM's training time (default 100)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts the target answers (default 2000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    unknown = [name for name in args.objectives.split(",") if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown objective(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.variants = args.objectives.split(",")
    args.budgets = [int(n) for n in args.tree_budgets.split(",") if n]
    # bench_tau's sizes and stages, with this bench's defaults over them
    tau = bench_tau.parse_args((["--tiny"] if args.tiny else []) + ["--device", args.device])
    if not args.tiny:
        tau.lm_seconds = 100.0 if args.lm_seconds is None else args.lm_seconds
        tau.prompts = 2000 if args.prompts is None else args.prompts
    else:
        tau.lm_seconds = tau.lm_seconds if args.lm_seconds is None else args.lm_seconds
        tau.prompts = tau.prompts if args.prompts is None else args.prompts
    tau.drafter_steps = args.steps or (4 if args.tiny else 400)
    if args.eval_prompts is not None:
        tau.eval_prompts = args.eval_prompts
    args.tau = tau
    args.device = tau.device
    # the data is prepared at bench_tau's block size whatever the drafters' (a shorter block keeps every sample)
    args.block_size = args.block_size or tau.block_size
    if args.block_size < 2:
        parser.error("--block-size must be at least 2")
    args.jobs = args.jobs or (6 if args.device == "cuda" else 1)
    return args


def build_target_and_data(work: Path, args) -> dict:
    """bench_tau's target and data, once: a second call in the same directory reads what the first one wrote."""
    import torch

    done = work / "target_and_data.json"
    if done.is_file():
        say(f"reusing the target and data in {work}")
        return json.loads(done.read_text())
    tau = args.tau
    snippets = bench_tau.code_snippets(max_bytes=int(tau.corpus_mb * 1e6), lines_per_snippet=16)
    import random

    random.Random(0).shuffle(snippets)
    cut = int(len(snippets) * 0.8)  # as bench_tau: the LM never sees the snippets the prompts come from
    say(f"training the target on {cut} snippets for up to {tau.lm_seconds:.0f}s")
    target = bench_tau.train_target(work / "target", snippets[:cut], tau, torch.device(tau.device))
    data = bench_tau.prepare_data(work, snippets[cut:], tau)
    count = bench_tau.heldout_prompts(work / "chats.jsonl", work / "heldout_prompts.jsonl", share=tau.heldout,
                                      count=tau.eval_prompts)
    result = {"target": target, "data": data, "eval_prompts": count}
    done.write_text(json.dumps(result))
    return result


def run_config(work: Path, args, name: str, steps: int, out: Path) -> dict:
    loss, slot_weights, architecture = VARIANTS[name]
    config = bench_tau.drafter_config(work, args.tau)
    # no held-out replay or batch replay: the step time is the objective's alone, and trainer eval measures τ
    config.update(output_dir=str(out), max_steps=steps, loss=loss, slot_weights=slot_weights,
                  architecture=architecture, block_size=args.block_size, seed=args.seed, eval_every=0,
                  replay_sequences=0, log_every=max(1, steps // 20))
    return config


def train(work: Path, args, name: str, steps: int, tag: str) -> Path:
    """A finished `trainer train` run of `steps` steps of variant `name` in runs/{name}-b{block}-s{seed}-{tag}/
    (reused when it finished before; started over when it did not)."""
    import yaml

    out = work / "runs" / f"{name}-b{args.block_size}-s{args.seed}-{tag}"
    if finished(out, steps):
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(run_config(work, args, name, steps, out), sort_keys=False))
    began = time.perf_counter()
    bench_tau.trainer_process("train", "--config", str(config), log=out / "train.log")
    say(f"{name} ({tag}): {steps} steps in {time.perf_counter() - began:.0f}s (process)")
    return out


def finished(out: Path, steps: int) -> bool:
    metrics = out / "metrics.jsonl"
    if not (out / f"step_{steps}").is_dir() or not metrics.is_file():
        return False
    return any(json.loads(line).get("event") == "finished" for line in metrics.read_text().splitlines())


def run_figures(out: Path) -> dict:
    """From the run's metrics.jsonl: the last logged loss and acc (and each term), seconds per step (median of the
    logged intervals after step 1, which holds the warm-up)."""
    records = bench_tau.step_records(out / "metrics.jsonl")
    last = records[-1]
    timed = [r["step_s"] for r in records if r["step"] > 1 and r.get("step_s")] or [records[-1]["step_s"]]
    tail = records[-3:]
    return {"steps": last["step"], "loss": round(last["loss"], 4),
            "acc": round(sum(r["acc"] for r in tail) / len(tail), 4),
            "terms": {k: round(v, 4) for k, v in last.items() if k.startswith("loss_")},
            "seconds_per_step": statistics.median(timed)}


def evaluate(work: Path, args, out: Path, steps: int) -> dict:
    """`trainer eval --tree-budget` of the run's last checkpoint on the held-out prompts (kept in eval.json)."""
    saved = out / "eval.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    tau = args.tau
    log = out / "eval.log"
    bench_tau.trainer_process(
        "eval", "--target", str(work / "target"), "--drafter", str(out / f"step_{steps}"),
        "--prompts", str(work / "heldout_prompts.jsonl"), "--max-new-tokens", str(tau.max_new_tokens),
        "--tree-budget", ",".join(map(str, args.budgets)), "--no-baseline", "--dtype", tau.eval_dtype,
        "--device", tau.device, "--json", log=log)
    report = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    result = {"chain_tau": round(report["tau"], 4), "identical_to_greedy": report["identical_to_greedy"],
              "rounds": report["rounds"],
              "tree_tau": {str(t["budget"]): round(t["tau"], 4) for t in report["trees"]},
              "trees_identical_to_greedy": all(t["identical_to_greedy"] for t in report["trees"])}
    saved.write_text(json.dumps(result))
    return result


def equal_time_steps(figures: dict[str, dict], steps: int, seconds: float | None) -> tuple[float, dict[str, int]]:
    """The wall-time budget and each objective's steps in it."""
    budget = seconds if seconds else max(f["seconds_per_step"] * steps for f in figures.values())
    return budget, {name: max(1, round(budget / f["seconds_per_step"])) for name, f in figures.items()}


def parallel(jobs: int, function, items: list) -> list:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(function, items))


def run(work: Path, args) -> dict:
    began = time.perf_counter()
    built = build_target_and_data(work, args)
    steps = args.tau.drafter_steps
    # the first process on a fresh machine pays cold caches (kernels, files): a short run that nobody measures
    train(work, args, args.variants[0], max(1, steps // 8), "warmup")
    say(f"(a) equal steps: {steps} steps per objective, one run at a time: {', '.join(args.variants)}")
    equal_steps = {name: train(work, args, name, steps, "steps") for name in args.variants}
    figures = {name: run_figures(out) for name, out in equal_steps.items()}
    budget, time_steps = equal_time_steps(figures, steps, args.seconds)
    say(f"(b) equal time: {budget:.1f}s of training steps each: "
        + ", ".join(f"{name} {n}" for name, n in time_steps.items()))

    # one pool for what is left: the equal-time runs to train and every checkpoint to evaluate, so evaluations of
    # (a) overlap the training of (b)
    tasks = [(name, steps, "steps", False) for name in args.variants]
    for name in args.variants:
        if abs(time_steps[name] - steps) >= SAME_RUN_SHARE * steps:
            tasks.append((name, time_steps[name], f"time{time_steps[name]}", True))
    say(f"{sum(t[3] for t in tasks)} equal-time runs and {len(tasks)} evaluations on {built['eval_prompts']} "
        f"held-out prompts, {args.jobs} at a time")

    def settle(task) -> tuple[Path, dict]:
        name, n, tag, needs_training = task
        out = train(work, args, name, n, tag) if needs_training else equal_steps[name]
        return out, evaluate(work, args, out, n)

    settled = dict(zip(tasks, parallel(args.jobs, settle, tasks)))
    evaluations = dict(settled.values())
    equal_time = {name: equal_steps[name] for name in args.variants}
    equal_time.update({name: out for (name, _, _, trained), (out, _) in settled.items() if trained})
    time_figures = {name: run_figures(out) for name, out in equal_time.items()}
    rows = []
    for name in args.variants:
        loss, slot_weights, architecture = VARIANTS[name]
        rows.append({"objective": name, "loss": loss, "slot_weights": slot_weights, "architecture": architecture,
                     "seconds_per_step": round(figures[name]["seconds_per_step"], 5),
                     "equal_steps": {**figures[name], **evaluations[equal_steps[name]]},
                     "equal_time": {**time_figures[name], **evaluations[equal_time[name]],
                                    "same_run_as_equal_steps": equal_time[name] == equal_steps[name]}})
    result = {"device": args.device, "size": args.tau.size, **built, "steps": steps,
              "block_size": args.block_size, "seed": args.seed,
              "equal_time_seconds": round(budget, 2), "tree_budgets": args.budgets, "rows": rows,
              "seconds": round(time.perf_counter() - began, 1)}
    result["markdown"] = markdown(result)
    return result


def markdown(result: dict) -> str:
    budgets = result["tree_budgets"]
    trees = "tree τ " + "/".join(map(str, budgets))
    lines = [f"| objective | s/step | chain τ ({result['steps']} steps) | {trees} | acc | steps in "
             f"{result['equal_time_seconds']:.3g}s | chain τ (equal time) | {trees} | acc |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in result["rows"]:
        cells = [row["objective"], f"{row['seconds_per_step']:.4f}"]
        for key in ("equal_steps", "equal_time"):
            part = row[key]
            if key == "equal_time":
                cells.append(str(part["steps"]))
            cells += [f"{part['chain_tau']:.3f}", " / ".join(f"{part['tree_tau'][str(b)]:.3f}" for b in budgets),
                      f"{part['acc']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench_tau.in_workdir(args.workdir, "bench_objectives-", lambda work: run(work, args))
    print(json.dumps(result, indent=1) if args.json else result["markdown"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
