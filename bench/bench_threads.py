"""Wall time of the small CPU jobs (`generate` and `train` on the tiny random target) with torch's default
threads against one thread, on an idle machine and under load (one busy process per core started here).

    python bench/bench_threads.py                       # 32 prompts x 32 tokens, 30 training steps
    python bench/bench_threads.py --repeats 3 --steps 60

Each job runs as a real process (`python -m trainer ...`), the model load excluded from generate's figure
(its summary's seconds) and included in train's (the process's wall time, start-up to the last step).
"Default" leaves OMP_NUM_THREADS unset, so the trainer's own choice applies; "OMP=N" sets it. The machine's
load average is printed beside each figure: on a shared machine "idle" means no load of this script's own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from trainer_env import REPO_ROOT, trainer_env  # bench/ is on sys.path when one of its scripts runs


def trainer(*args: str, omp: str | None) -> tuple[float, str]:
    env = trainer_env(CUDA_VISIBLE_DEVICES="")
    env.pop("OMP_NUM_THREADS", None)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        sys.exit(f"trainer {args[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.monotonic() - started, done.stdout


def make_inputs(root: Path, prompts: int, tokens: int) -> dict[str, Path]:
    sys.path.insert(0, str(REPO_ROOT))
    from bench_generate import write_prompts

    target, chats, dataset = root / "target", root / "chats.jsonl", root / "dataset"
    trainer("tiny-target", str(target), omp="1")
    write_prompts(root / "prompts.jsonl", prompts)
    trainer("generate", "--target", str(target), "--prompts", str(root / "prompts.jsonl"), "--output",
            str(chats), "--max-new-tokens", str(tokens), "--batch-size", str(prompts), "--device", "cpu", omp="1")
    trainer("prepare", "--target", str(target), "--input", str(chats), "--output", str(dataset),
            "--block-size", "8", omp="1")
    return {"target": target, "prompts": root / "prompts.jsonl", "dataset": dataset}


def generate_seconds(root: Path, inputs: dict[str, Path], tokens: int, batch: int, omp: str | None) -> float:
    output = Path(tempfile.mkdtemp(dir=root)) / "answers.jsonl"
    _, stdout = trainer("generate", "--target", str(inputs["target"]), "--prompts", str(inputs["prompts"]),
                        "--output", str(output), "--max-new-tokens", str(tokens), "--batch-size", str(batch),
                        "--device", "cpu", "--json", omp=omp)
    return json.loads(stdout)["seconds"]


def train_seconds(root: Path, inputs: dict[str, Path], steps: int, omp: str | None) -> float:
    out = Path(tempfile.mkdtemp(dir=root))
    config = {"target_path": str(inputs["target"]), "data_path": str(inputs["dataset"]),
              "output_dir": str(out / "run"), "max_steps": steps, "block_size": 8, "num_anchors": 16,
              "drafter_layers": 1, "token_budget": 2048, "buckets": [0, 128, 256, 512], "lr": 3e-3,
              "warmup_ratio": 0.1, "log_every": 10, "checkpoint_every": 0, "seed": 0, "device": "cpu",
              "num_workers": 1, "prefetch": 2}
    (out / "run.yaml").write_text(yaml.safe_dump(config))
    seconds, _ = trainer("train", "--config", str(out / "run.yaml"), omp=omp)
    return seconds


def spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32, help="prompts generated (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer (default 32)")
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case (default 1)")
    parser.add_argument("--threads", default="default,1", help="comma-separated: default and/or numbers")
    args = parser.parse_args()
    cases = [None if name == "default" else name for name in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inputs = make_inputs(root, args.prompts, args.max_new_tokens)
        print(f"{os.cpu_count()} CPUs; generate {args.prompts} prompts x {args.max_new_tokens} tokens, "
              f"train {args.steps} steps", flush=True)
        for load in ("idle", "busy"):
            busy = spinners(os.cpu_count() or 1) if load == "busy" else []
            try:
                for omp in cases:
                    for _ in range(args.repeats):
                        shown = "default" if omp is None else f"OMP={omp}"
                        load_avg = os.getloadavg()[0]
                        gen = generate_seconds(root, inputs, args.max_new_tokens, args.prompts, omp)
                        train = train_seconds(root, inputs, args.steps, omp)
                        print(f"{load:<5} {shown:<8} generate {gen:7.2f} s  train {train:7.2f} s  "
                              f"(load average {load_avg:.1f} before)", flush=True)
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
