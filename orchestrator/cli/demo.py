"""`dflashctl demo [--steps N] [--no-watch]`: the quick start on this machine, CPU only, nothing downloaded.

Makes a tiny random Qwen3 target and a dataset of its own answers (the DFlash recipe), launches a real short
training run on the `local` target through the same path as `dflashctl launch local --config`, and watches it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import typer
import yaml

from dflash_records.protocol import SUCCEEDED, TERMINAL_STATES
from dflash_records.run import RunRecord

from ..display import format_rate
from ..errors import EXIT_FAILED, EXIT_OK, OperationFailed, UsageError
from ..runs.client import RunClient
from ..transports.pool import Connections
from ..watch.model import RunView
from ..watch.source import LiveSource
from .args import number_in
from .launch import launch_spec
from .output import stderr, stdout
from .state import AppState

PROMPTS = 48
PROMPT_BATCH = 8          # answered in batches, so that progress shows while the others wait
PROGRESS_EVERY_S = 3.0
GENERATE_PROGRESS = "] generate answered="   # generate's progress lines (trainer/logformat.py)
ANSWER_TOKENS = 64
WAIT_LIMIT_S = 1800.0


def demo(
    ctx: typer.Context,
    steps: int = typer.Option(160, "--steps", callback=number_in(1), metavar="N", help="Training steps of the demo run."),
    no_watch: bool = typer.Option(False, "--no-watch", help="Wait for the run to end and print its summary "
                                                            "instead of opening the dashboard."),
) -> int:
    """Make a tiny model and data, launch a short CPU training run on `local`, and watch it.

    Everything lands in the local target's workdir under demo/ (the model and data are made once and reused).
    """
    state: AppState = ctx.obj
    inventory = state.inventory()
    # the run must find torch: use this interpreter, not whatever `python3` is first on PATH
    target = dataclasses.replace(inventory.target("local"), python=sys.executable)
    base = Path(target.workdir) / "demo"
    target_dir, dataset = prepare_demo_data(base)
    config = write_demo_config(base, target_dir, dataset, steps=steps)
    spec = launch_spec(target, [], name="demo", config=config, gpus=None, env={},
                 force=True, grace=5.0)
    with Connections() as conns:
        run_id = RunClient(inventory, conns).launch(spec).run_id
    stderr().print(f"launched {run_id} on local ({steps} steps); "
                   f"`dflashctl watch local` or `dflashctl logs -f {run_id}` to follow it")
    source = LiveSource(inventory, [target])
    if not no_watch:
        from tui import run_dashboard

        run_dashboard(source)
        return EXIT_OK
    with source:
        run = wait_until_ended(source, run_id)
    print_summary(run)
    return EXIT_OK if run.state == SUCCEEDED else EXIT_FAILED


def prepare_demo_data(base: Path) -> tuple[Path, Path]:
    """The tiny target and its self-generated, prepared dataset (made once, reused after).

    Made by the trainer's own CLI in child processes: the controller, which then runs the dashboard, never
    imports torch.
    """
    try:
        from trainer.model.tiny_target import tokenizer_corpus  # torch-free
    except ImportError as exc:
        raise UsageError(f"the demo needs the training extra: pip install -e '.[train]' ({exc})") from None
    target_dir, dataset = base / "target", base / "dataset"
    if (dataset / "done").is_file():
        return target_dir, dataset
    err = stderr()
    err.print(f"making a tiny random Qwen3 target in {target_dir}...")
    _trainer("tiny-target", str(target_dir), "--seed", "0")
    prompts, chats = base / "prompts.jsonl", base / "chats.jsonl"
    write_prompts(prompts, tokenizer_corpus())
    err.print(f"letting it answer {PROMPTS} prompts (the drafter learns to predict its own answers)...")
    _trainer("generate", "--target", str(target_dir), "--prompts", str(prompts), "--output", str(chats),
             "--max-new-tokens", str(ANSWER_TOKENS), "--batch-size", str(PROMPT_BATCH), "--device", "cpu",
             "--progress-every", str(PROGRESS_EVERY_S), shown=GENERATE_PROGRESS)
    _trainer("prepare", "--target", str(target_dir), "--input", str(chats), "--output", str(dataset),
             "--block-size", "8", "--force")  # a dataset an interrupted demo left without its `done`
    (dataset / "done").write_text("ok\n")
    return target_dir, dataset


def _trainer(*args: str, shown: str | None = None) -> None:
    """`python -m trainer ARGS` with its output kept for the error; the lines containing `shown` (its progress)
    are passed on as they come, so that a step of a minute is not a minute of silence."""
    tail: deque[str] = deque(maxlen=15)
    with subprocess.Popen([sys.executable, "-m", "trainer", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}) as child:
        for line in child.stdout:
            tail.append(line.rstrip("\n"))
            if shown is not None and shown in line:
                stderr().print(f"  {line.strip()}", markup=False)
    if child.returncode != 0:
        raise OperationFailed(f"`python -m trainer {args[0]}` failed (exit {child.returncode}):\n" + "\n".join(tail))


def write_prompts(path: Path, corpus: list[str]) -> None:
    rng = random.Random(1)
    words = " ".join(corpus).split()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as sink:
        for _ in range(PROMPTS):
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(6, 16)))
            sink.write(json.dumps({"messages": [{"role": "user", "content": prompt}]}) + "\n")


def write_demo_config(base: Path, target_dir: Path, dataset: Path, *, steps: int) -> Path:
    """`base/demo.yaml`, the config docs/trainer.md shows ("A small CPU run"; a test holds them the same): its
    paths relative to base (a launch on `local` takes them from the config's directory), so the directory can be
    copied whole; a new output_dir per demo, so a second demo trains afresh instead of resuming the first."""
    config = {
        "target_path": os.path.relpath(target_dir, base), "data_path": os.path.relpath(dataset, base),
        "output_dir": f"out-{time.strftime('%Y%m%d-%H%M%S')}", "device": "cpu",
        "max_steps": steps, "block_size": 8, "num_anchors": 16, "drafter_layers": 1, "token_budget": 2048,
        "buckets": [0, 128, 256, 512], "lr": 3e-3, "warmup_ratio": 0.1, "log_every": 5, "checkpoint_every": 0,
        "seed": 0, "num_workers": 1, "prefetch": 2,
    }
    path = base / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, default_flow_style=None))
    return path


def wait_until_ended(source: LiveSource, run_id: str) -> RunView:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        run = _find(source, run_id)
        if run is not None and run.state in TERMINAL_STATES:
            time.sleep(1.0)  # the log's last bytes may trail the state change by a poll
            return _find(source, run_id) or run
        source.wait_for_change(1.0)
    raise OperationFailed(f"{run_id} did not end within {WAIT_LIMIT_S:.0f}s")


def _find(source: LiveSource, run_id: str) -> RunView | None:
    return next((run for run in source.snapshot().runs if run.run_id == run_id), None)


def print_summary(run: RunView) -> None:
    out = stdout()
    ended = RunRecord(state=run.state, exit_code=run.exit_code, signal=run.signal).ended_text()
    out.print(f"{run.run_id}: {ended}", markup=False)
    if run.history:
        first, last = run.history[0], run.history[-1]
        out.print(f"steps {first.step}..{last.step}: loss {first.loss} -> {last.loss}, acc {first.acc} -> "
                  f"{last.acc}, {format_rate(last.tok_per_s)} tok/s", markup=False)
    out.print(f"exceptions: {run.exceptions}; log: {run.log_path}", markup=False)
    for line in run.log_tail[-5:]:
        out.print(f"  {line}", markup=False)

