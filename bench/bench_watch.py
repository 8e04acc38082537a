"""Benchmark of the watch data path against a lab of its own (needs root, like the lab tests).

    python -m bench.bench_watch [--runs-per-host 10] [--cpu-seconds 20] [--big-log-gb 1]

Prints three figures:
  - latency: median time from a step line appended to a run's log in a lab container to the LiveSource's
    snapshot showing it (goal <= 1 s);
  - attach: time from creating a LiveSource to having parsed the tail of a run whose log is 1 GB (goal <= 2 s:
    only the last 256 KiB is read), and the first full-log line count (the sparse index, ~1 s per GB);
  - CPU: the controller's process CPU time / wall time while watching RUNS_PER_HOST runs on each of 3 hosts,
    every run printing a step line a second and nvidia-smi sampled every second (goal <= 20 % of one core).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.inventory.model import load_inventory  # noqa: E402
from orchestrator.runs.client import RunClient  # noqa: E402
from orchestrator.runs.spec import LaunchSpec, runs_dir  # noqa: E402
from orchestrator.transports.pool import Connections  # noqa: E402
from orchestrator.watch.source import LiveSource  # noqa: E402
from tests.lab.lab import ContainerSpec, HostSpec, Lab  # noqa: E402

STEP = ("[{i}s] step={i} loss=2.5 acc=0.1 streak=0.5 lr=1e-4 noise=0.0 | tgt=1.0b/s dft=1.0b/s (11.7Ktok/s) | "
        "q_pre=[5] q_hs=[2] | epoch~0.01 ETA=1h")
EVERY_SECOND = ("import time\ni = 0\nwhile True:\n    i += 1\n    print(" + repr(STEP) + ".format(i=i), flush=True)\n"
                "    time.sleep(1.0)")
QUIET = "import time; time.sleep(3600)"
SPEC = tuple(HostSpec(f"pve{n}", (ContainerSpec(100 + n, gpus=8),)) for n in (1, 2, 3))


def launch_runs(inventory, targets, per_host: int, code: str) -> list[tuple[str, str]]:
    with Connections() as conns:
        client = RunClient(inventory, conns)

        def on(target):
            return [(target.name, client.launch(LaunchSpec(target, [sys.executable, "-c", code], f"b{i}")).run_id)
                    for i in range(per_host)]
        with ThreadPoolExecutor(len(targets)) as pool:
            return [run for runs in pool.map(on, targets) for run in runs]


def kill_runs(inventory, runs: list[tuple[str, str]]) -> None:
    with Connections() as conns:
        client = RunClient(inventory, conns)
        by_target: dict[str, list[str]] = {}
        for target, run_id in runs:
            by_target.setdefault(target, []).append(run_id)
        for target, run_ids in by_target.items():
            client.kill(inventory.target(target), run_ids, grace=1)


def host_log(lab: Lab, inventory, target: str, run_id: str) -> Path:
    host, ctid = target.split("/")
    inside = runs_dir(inventory.target(target)).removeprefix("/workspace/")
    return lab.hosts[host].containers[int(ctid)].workspace / inside / run_id / "train.log"


def wait_for(source: LiveSource, predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(source.snapshot()):
            return True
        source.wait_for_change(0.05)
    return False


def last_step(snapshot, run_id: str):
    return next((r.last_step for r in snapshot.runs if r.run_id == run_id), None)


def bench_latency(lab, inventory, targets, samples: int = 30) -> float:
    runs = launch_runs(inventory, targets[:1], 1, QUIET)
    target, run_id = runs[0]
    log = host_log(lab, inventory, target, run_id)
    delays = []
    with LiveSource(inventory, targets) as source:
        source.wait_until_answered(30)
        for i in range(1, samples + 1):
            started = time.monotonic()
            with log.open("a") as handle:
                handle.write(STEP.format(i=i) + "\n")
            if wait_for(source, lambda s: last_step(s, run_id) == i):
                delays.append(time.monotonic() - started)
            time.sleep(0.2 * (i % 3))  # not in phase with the agent's polling
    kill_runs(inventory, runs)
    return statistics.median(delays)


def bench_attach(lab, inventory, target, gigabytes: float) -> tuple[float, float, float]:
    runs = launch_runs(inventory, [target], 1, QUIET)
    _, run_id = runs[0]
    log = host_log(lab, inventory, target.name, run_id)
    block = "".join(STEP.format(i=i) + "\n" for i in range(1, 5001)).encode()
    with log.open("ab") as handle:
        for _ in range(int(gigabytes * 2**30 / len(block))):
            handle.write(block)
        handle.write((STEP.format(i=999999) + "\n").encode())
    size_gb = log.stat().st_size / 2**30
    started = time.monotonic()
    with LiveSource(inventory, [target]) as source:
        source.wait_until_answered(60)
        attached = wait_for(source, lambda s: last_step(s, run_id) == 999999, 30)
        attach_s = time.monotonic() - started
        started = time.monotonic()
        count = source.log_line_count(run_id)
        index_s = time.monotonic() - started
    kill_runs(inventory, runs)
    assert attached and count > 1000, (attached, count)
    return size_gb, attach_s, index_s


def bench_cpu(inventory, targets, per_host: int, seconds: float) -> tuple[int, float]:
    runs = launch_runs(inventory, targets, per_host, EVERY_SECOND)
    try:
        with LiveSource(inventory, targets, gpu_interval=1.0) as source:
            source.wait_until_answered(60)
            wait_for(source, lambda s: all((last_step(s, r) or 0) >= 1 for _, r in runs), 30)
            cpu0, wall0 = time.process_time(), time.monotonic()
            deadline = wall0 + seconds
            while time.monotonic() < deadline:  # as the dashboard does: a snapshot after each change, <= 2/s
                if source.wait_for_change(0.5):
                    source.snapshot()
                    time.sleep(0.5)
            share = (time.process_time() - cpu0) / (time.monotonic() - wall0)
            live = sum(1 for r in source.snapshot().runs if r.state == "running")
    finally:
        kill_runs(inventory, runs)
    return live, share


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-per-host", type=int, default=10)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    parser.add_argument("--big-log-gb", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as root, Lab.start(Path(root), SPEC) as lab:
        inventory = load_inventory(lab.write_inventory(Path(root) / "inventory.yaml"))
        targets = [inventory.target(f"pve{n}/{100 + n}") for n in (1, 2, 3)]
        latency = bench_latency(lab, inventory, targets)
        print(f"latency, appended line -> LiveSource state: median {latency * 1000:.0f} ms (goal <= 1000 ms)")
        size_gb, attach_s, index_s = bench_attach(lab, inventory, targets[1], args.big_log_gb)
        print(f"attach to a {size_gb:.2f} GB log: {attach_s:.2f} s (goal <= 2 s); "
              f"first full-log line count (sparse index): {index_s:.2f} s")
        live, share = bench_cpu(inventory, targets, args.runs_per_host, args.cpu_seconds)
        print(f"controller CPU watching {live} runs on {len(targets)} hosts, 1 step line/s each and 1 GPU "
              f"sample/s per host: {share * 100:.1f} % of one core (goal <= 20 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
