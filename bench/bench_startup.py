"""How long a real `python -m trainer train` takes to its first step line, and whether later steps stall.

Makes a random target of a real shape and random data in the seed's buckets once (kept in --workdir), then runs
the trainer as a user would, with the default config (49,152 tokens per batch) and one step line per step.
--start cold gives it empty Inductor/Triton caches; --start warm reuses the caches of the previous run.

    python bench/bench_startup.py --shape qwen3-8b --start cold --steps 50 --workdir /tmp/startup
    python bench/bench_startup.py --shape qwen3-8b --start warm --steps 10 --workdir /tmp/startup

Prints the start-up stages with their seconds, target loaded -> first step line, and the step times (from the
step lines' metrics.jsonl records): median, and every step after step 3 above 2 x the median.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGE = re.compile(r"Start-up \[(\d+(?:\.\d*)?)s\]: (.+)")


def prepare_inputs(workdir: Path, shape: str, samples: int, max_len: int, device: str) -> tuple[Path, Path]:
    from synthetic import SHAPES, write_random_dataset, write_random_target

    target, data = workdir / f"{shape}-random", workdir / f"data-{samples}-{max_len}"
    if not (target / "config.json").exists():
        write_random_target(target, shape, device=device)
    if not (data / "dataset_info.json").exists():
        write_random_dataset(data, samples=samples, min_len=200, max_len=max_len, vocab=SHAPES[shape]["vocab_size"])
    return target, data


def run_trainer(config: Path, cache: Path, timeout: float) -> tuple[list[tuple[float, str]], int]:
    """(host seconds since launch, line) of every stdout line, and the exit code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "TRITON_CACHE_DIR": str(cache / "triton")}
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    lines = []
    try:
        for line in process.stdout:
            lines.append((time.perf_counter() - began, line.rstrip("\n")))
            print(f"[{lines[-1][0]:7.1f}s] {lines[-1][1]}", file=sys.stderr, flush=True)
            if time.perf_counter() - began > timeout:
                process.terminate()
    finally:
        code = process.wait()
    return lines, code


def step_seconds(metrics: Path) -> dict[int, float]:
    """Seconds of each step, from consecutive step records' elapsed_s (one record per step)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [(r["step"], r["elapsed_s"]) for r in records if r.get("event") == "step"]
    return {b[0]: b[1] - a[1] for a, b in zip(steps, steps[1:])}


def summarize(lines, steps: dict[int, float]) -> dict:
    stages = {m[2]: float(m[1]) for _, text in lines if (m := STAGE.fullmatch(text))}
    host = {m[2]: t for t, text in lines if (m := STAGE.fullmatch(text))}
    first_step_line = next((t for t, text in lines if re.search(r"\] step=1 ", text)), None)
    loaded = host.get("building drafter")
    later = {s: v for s, v in steps.items() if s > 3}
    median = statistics.median(later.values()) if later else None
    return {
        "stages_s": stages,
        "first_step_line_s": first_step_line,
        "target_loaded_to_first_step_s": None if first_step_line is None or loaded is None
        else round(first_step_line - loaded, 1),
        "median_step_s": median,
        "steps_over_2x_median": {s: round(v, 2) for s, v in later.items() if median and v > 2 * median},
        "max_step_after_3_s": max(later.values()) if later else None,
        "step_s": {s: round(v, 3) for s, v in steps.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--start", choices=("cold", "warm"), default="cold")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--max-len", type=int, default=8192, help="longest sample (the seed's last bucket ends at 8193)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dflash-startup"))
    parser.add_argument("--compile", action="store_true", help="compile: true in the config")
    parser.add_argument("--timeout", type=float, default=540)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    target, data = prepare_inputs(args.workdir, args.shape, args.samples, args.max_len, args.device)
    cache = args.workdir / "compile-cache"
    if args.start == "cold":
        shutil.rmtree(cache, ignore_errors=True)
    out = args.workdir / f"out-{args.start}"
    shutil.rmtree(out, ignore_errors=True)
    config = args.workdir / f"{args.start}.yaml"
    config.write_text(yaml.safe_dump({
        "target_path": str(target), "data_path": str(data), "output_dir": str(out), "max_steps": args.steps,
        "log_every": 1, "checkpoint_every": 0, "device": args.device, "compile": args.compile,
        **({} if args.max_len >= 8192 else {"buckets": [0, args.max_len // 2, args.max_len + 1],
                                            "max_length": args.max_len, "token_budget": 4 * args.max_len})}))
    lines, code = run_trainer(config, cache, args.timeout)
    metrics = out / "metrics.jsonl"
    report = {"shape": args.shape, "start": args.start, "exit_code": code,
              **summarize(lines, step_seconds(metrics) if metrics.exists() else {})}
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
