"""The whole tool end to end on this machine's `local` target, as a user runs it:

1. `dflashctl launch local --config run.yaml --gpus 0` starts a real training run (a random-initialised target
   of a real shape, random token data; with several GPUs, one process per GPU under torchrun);
2. `dflashctl watch --once --json local` until it shows step lines, with nvidia-smi's memory and utilisation;
3. `dflashctl kill RUN`, then nvidia-smi until every GPU's memory is back at its idle value.

Prints one JSON report and exits 1 if a check failed. On a machine without nvidia-smi (`--device cpu`) the
GPU checks are reported under `skipped`, never as passed.

    python bench/e2e_local.py --shape qwen3-1.7b --workdir /tmp/e2e | tee e2e.json
    python bench/e2e_local.py --shape qwen3-1.7b --gpus 0-7 --workdir /tmp/e2e        # eight GPUs
    python bench/e2e_local.py --shape tiny --device cpu --workdir /tmp/e2e       # the same flow on a CPU
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from orchestrator.cli.args import parse_gpus

IDLE_TOLERANCE_MIB = 64   # what a driver's bookkeeping moves by with no process on the GPU


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-1.7b", help="a SHAPES name of bench/synthetic.py: the target")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--gpus", default="0", help="the GPUs the run gets, as launch takes them: 0, 0,1, 0-7")
    parser.add_argument("--workdir", type=Path, required=True, help="where the target, data and run output go")
    parser.add_argument("--steps-seen", type=int, default=10, help="wait until watch shows this step")
    parser.add_argument("--wait", type=float, default=900.0,
                        help="longest wait for the step lines, seconds (the first steps compile kernels)")
    parser.add_argument("--grace", type=float, default=10.0, help="kill's grace after TERM, seconds")
    return parser.parse_args(argv)


def cli(*args: str, timeout: float = 300.0) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def gpu_memory_mib(indices: list[int]) -> dict[int, int] | None:
    """Memory used per GPU, MiB, by nvidia-smi; None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    used = {int(index): int(mib) for index, mib in (line.split(",") for line in out.strip().splitlines())}
    return {index: used[index] for index in indices}


def above_idle(used: dict[int, int], idle: dict[int, int]) -> dict[int, int]:
    return {index: used[index] - idle[index] for index in idle if used[index] > idle[index] + IDLE_TOLERANCE_MIB}


def progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def make_inputs(args) -> Path:
    """The target, the data and the trainer config (the target and data are made once per workdir and shape)."""
    from synthetic import SHAPES, write_random_dataset, write_random_target

    args.workdir.mkdir(parents=True, exist_ok=True)
    target = args.workdir / f"target-{args.shape}"
    if not (target / "config.json").is_file():
        # made in a child process (on the GPU when there is one: an 8B shape takes minutes on a CPU), so this
        # process never holds GPU memory of its own and nvidia-smi's idle value is the GPU's
        progress(f"writing a random {args.shape} target")
        make = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[4]); "
                "from synthetic import write_random_target; "
                "write_random_target(Path(sys.argv[1]), sys.argv[2], device=sys.argv[3])")
        subprocess.run([sys.executable, "-c", make, str(target), args.shape, args.device, str(Path(__file__).parent)],
                       check=True)
    # a GPU gets the trainer's defaults (5 drafter layers, B=16, 512 anchors); a CPU a size it can step through
    sizes = (dict(buckets=[0, 1024, 2048, 4097], token_budget=16384) if args.device == "cuda" else
             dict(buckets=[0, 128, 257], token_budget=1024, drafter_layers=1, block_size=8, num_anchors=16))
    data = args.workdir / f"data-{args.shape}-{sizes['buckets'][-1] - 1}"   # ids within the shape's vocabulary
    if not data.is_dir():
        write_random_dataset(data, samples=2000, min_len=64, max_len=sizes["buckets"][-1] - 1,
                             vocab=SHAPES[args.shape]["vocab_size"])
    config = {"target_path": str(target), "data_path": str(data), "device": args.device,
              "output_dir": str(args.workdir / f"out-{time.strftime('%Y%m%d-%H%M%S')}"),
              "max_steps": 100_000, "log_every": 2, "checkpoint_every": 0, "num_workers": 4, **sizes}
    path = args.workdir / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def watch_until_steps(args, run_id: str) -> tuple[dict, list, float]:
    """(the run as watch shows it, the run's GPUs as watch shows them, seconds waited) once the run logged a step
    at or past --steps-seen, ended, or --wait passed."""
    began = time.monotonic()
    run, gpus = {}, []
    while time.monotonic() - began < args.wait:
        code, out, err = cli("watch", "--once", "--json", "local")
        if code != 0:
            raise SystemExit(f"watch --once --json failed ({code}): {err}")
        snapshot = json.loads(out)
        run = next((r for r in snapshot["runs"] if r["run_id"] == run_id), {})
        gpus = [g for g in snapshot["gpus"] if g["index"] in args.gpu_list]
        if run.get("state") not in (None, "running", "starting") or (run.get("last_step") or 0) >= args.steps_seen:
            break
        time.sleep(5)
    return run, gpus, time.monotonic() - began


def memory_back_to_idle(args, idle: dict | None, limit: float = 60.0) -> tuple[float | None, dict | None]:
    """(seconds after kill returned until every GPU's memory is within the tolerance of idle, last reading)."""
    if idle is None:
        return None, None
    began = time.monotonic()
    used = gpu_memory_mib(args.gpu_list)
    while above_idle(used, idle) and time.monotonic() - began < limit:
        time.sleep(0.25)
        used = gpu_memory_mib(args.gpu_list)
    return time.monotonic() - began, used


def main(argv=None) -> int:
    args = parse_args(argv)
    args.gpu_list = parse_gpus(args.gpus)
    config = make_inputs(args)
    idle = gpu_memory_mib(args.gpu_list)
    report: dict = {"shape": args.shape, "device": args.device, "idle_memory_mib": idle}

    progress("dflashctl launch local")
    started = time.monotonic()
    code, out, err = cli("launch", "local", "--config", str(config), "--name", "e2e", "--json",
                         "--grace", str(args.grace), *(["--gpus", args.gpus] if args.device == "cuda" else []))
    if code != 0:
        print(out, err, file=sys.stderr)
        return 1
    run_id = json.loads(out)["run_id"]
    report["launch_s"] = round(time.monotonic() - started, 2)
    report["run_id"] = run_id
    # whatever happens while watching (an outer timeout's TERM included), the run is stopped: it is detached and
    # would otherwise hold the GPU after this script is gone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        progress(f"launched {run_id} in {report['launch_s']} s; watching until step {args.steps_seen}")
        run, gpus, waited = watch_until_steps(args, run_id)
    finally:
        progress("dflashctl kill")
        kill_started = time.monotonic()
        code, out, err = cli("kill", run_id, "--json", "--grace", str(args.grace))
        kill_s = time.monotonic() - kill_started
    report["watch"] = {"seconds_to_step": round(waited, 1), "state": run.get("state"),
                       "last_step": run.get("last_step"), "loss": run.get("loss"), "tok_per_s": run.get("tok_per_s"),
                       "gpus": [{k: g.get(k) for k in ("index", "memory_used_mib", "memory_total_mib",
                                                       "utilization_pct")} for g in gpus]}

    killed = [run for target in json.loads(out)["targets"].values() for run in target.get("runs", [])] \
        if out.strip() else []
    report["kill"] = {"exit": code, "seconds": round(kill_s, 2),
                      "runs": [{k: run.get(k) for k in ("state", "signal", "survivors", "actions")} for run in killed],
                      "stderr": err.strip()[-2000:]}
    back, last = memory_back_to_idle(args, idle)
    report["memory_back_to_idle_s"] = None if back is None else round(back, 2)
    report["memory_after_kill_mib"] = last
    report["launch_to_idle_s"] = round(time.monotonic() - started, 1)   # launch, watch, kill, GPU memory back
    survivors = subprocess.run(["grep", "-l", f"DFLASH_RUN_ID={run_id}", *Path("/proc").glob("[0-9]*/environ")],
                               capture_output=True, text=True).stdout.split()
    report["processes_left"] = survivors

    on_gpu = args.device == "cuda"
    in_use = {g["index"]: (g.get("memory_used_mib") or 0) for g in gpus}
    checks = {
        "watch showed step lines": (run.get("last_step") or 0) >= args.steps_seen,
        "kill exited 0": code == 0,
        "no process of the run is left": not survivors,
    }
    gpu_checks = {
        "watch showed every GPU's memory in use": lambda: (
            sorted(in_use) == args.gpu_list and all(in_use[i] > idle[i] + 1024 for i in in_use)),
        "every GPU's memory back to idle within 10 s of kill": lambda: (
            back is not None and back <= 10.0 and not above_idle(last, idle)),
    }
    if on_gpu:  # without a GPU these cannot be made: said so, never counted as passed
        checks.update({name: check() for name, check in gpu_checks.items()})
    report["checks"] = checks
    report["skipped"] = [] if on_gpu else sorted(gpu_checks)
    report["passed"] = all(checks.values())
    print(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
