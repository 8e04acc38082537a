"""From a failure to the next attempt's first step, under `launch --restart`, on the lab (real sshd + pct stand-in).

Run as root from the repo root:  python3 bench/bench_restart.py [--restarts 10] [--trainer-restarts 3]
Not a test: it prints medians and 90th percentiles for bench/RESULTS.md; nothing here asserts a speed.

Two workloads, both with `--restart-backoff 0`, so the figures are what the restart itself costs (the default
backoff adds 10 s, then 20 s, ... on top):
- a Python script that prints a step line, then exits 1 half a second later: the gap between its own timestamps
  (the exit, the next attempt's step line) is the supervisor's noticing, recording and starting again, plus
  Python's start;
- the bundled trainer on the tiny target (CPU), SIGKILLed from the host after its first step lines: from the
  kill to the first step line of the restarted trainer in its log (polled every 10 ms), which includes importing
  torch, loading the target and the checkpoint (`--resume auto`) and the first step.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_lifecycle import tiny_trainer_config  # noqa: E402
from orchestrator.cli.launch import launch_spec  # noqa: E402
from orchestrator.inventory.model import load_inventory  # noqa: E402
from orchestrator.runs.client import RunClient  # noqa: E402
from orchestrator.runs.spec import LaunchSpec  # noqa: E402
from orchestrator.transports.pool import Connections  # noqa: E402
from tests.lab.lab import Lab  # noqa: E402

FAILING = """
import sys, time
def mark(what):
    with open("timings", "a") as handle:
        handle.write("%s %.6f\\n" % (what, time.time()))
mark("step")
print("[0s] step=1 loss=1.0", flush=True)
time.sleep(0.5)
mark("fail")
sys.exit(1)
"""
STEP_LINE = re.compile(r"\] step=\d+ ")


def describe(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"{name:<72} median {statistics.median(values) * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   (n={len(values)})"


def wait(predicate, timeout: float, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError("waited {:g} s".format(timeout))


def outside(lab: Lab, host: str, ctid: int, path: str) -> Path:
    """A path of the container's /workspace as the host's filesystem has it."""
    return lab.hosts[host].containers[ctid].workspace / path.removeprefix("/workspace/")


def script_gaps(client: RunClient, lab: Lab, target, restarts: int) -> list[float]:
    spec = LaunchSpec(target=target, name="benchrestart", command=["python3", "-c", FAILING], settle=0.1,
                      restart=f"on-failure:{restarts}", restart_backoff=0.0)
    record = client.launch(spec)
    run_dir = outside(lab, "pve1", 200, record.run_dir)
    wait(lambda: json.loads((run_dir / "state.json").read_text())["state"] == "failed", 60 + restarts * 5, 0.1)
    marks = [line.split() for line in (run_dir / "timings").read_text().splitlines()]
    return [float(step) - float(fail) for (what, fail), (kind, step) in zip(marks[1::2], marks[2::2])
            if (what, kind) == ("fail", "step")]


def trainer_gaps(client: RunClient, lab: Lab, target, restarts: int, config: Path) -> tuple:
    """(kill -> the next attempt's first step, each restart; launch -> the first step of the first attempt;
    how many attempts said they resumed from a checkpoint)."""
    # one trainer process (--gpus none: no torchrun), a checkpoint every 2 steps to resume from
    config.write_text(config.read_text() + "checkpoint_every: 2\nlog_every: 1\n")
    spec = launch_spec(target, [], name="benchtrainer", config=config, gpus=[], env={}, force=False, grace=2)
    spec.restart, spec.restart_backoff = f"on-failure:{restarts}", 0.0
    launched = time.perf_counter()
    record = client.launch(spec)
    log = outside(lab, "pve1", 200, record.log_path)
    wait(lambda: STEP_LINE.search(log.read_text(errors="replace")), 300)
    cold, gaps = time.perf_counter() - launched, []
    try:
        for _ in range(restarts):
            seen = len(wait(lambda: STEP_LINE.findall(log.read_text(errors="replace")), 300, 0.1))
            wait(lambda: len(STEP_LINE.findall(log.read_text(errors="replace"))) >= seen + 2, 120, 0.1)
            trainer = next(p for p in lab.ct_processes("pve1", 200)
                           if p.environ.get("DFLASH_RUN_ID") == record.run_id and "trainer" in p.cmdline
                           and p.state != "Z")
            size = log.stat().st_size
            killed = time.perf_counter()
            os.kill(trainer.host_pid, signal.SIGKILL)
            wait(lambda: STEP_LINE.search(log.read_bytes()[size:].decode(errors="replace")), 300)
            gaps.append(time.perf_counter() - killed)
    finally:
        client.kill(target, [record.run_id], grace=2)
    return gaps, cold, log.read_text(errors="replace").count("Resumed from ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--trainer-restarts", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Lab.start(Path(tmp) / "lab") as lab:
        inventory = load_inventory(lab.write_inventory(Path(tmp) / "inventory.yaml"))
        target = inventory.target("pve1/200")
        with Connections() as conns:
            client = RunClient(inventory, conns)
            client.launch(LaunchSpec(target=target, name="warmup", command=["true"], settle=0))  # deploy once
            rows.append(describe("python script: its exit 1 -> the next attempt's step line, backoff 0",
                                 script_gaps(client, lab, target, args.restarts)))
            if args.trainer_restarts:
                config = tiny_trainer_config(Path(tmp) / "tiny")
                gaps, cold, resumed = trainer_gaps(client, lab, target, args.trainer_restarts, config)
                rows.append(describe("bundled trainer (tiny, CPU): SIGKILL -> the resumed attempt's first step",
                                     gaps))
                rows.append(describe("bundled trainer (tiny, CPU): launch -> the first attempt's first step",
                                     [cold]))
                rows.append(f"restarted attempts that resumed from a checkpoint: {resumed} of {len(gaps)}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
