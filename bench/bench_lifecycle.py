"""Launch-to-verified latency and kill-to-gone time on the lab (real sshd + pct stand-in), as figures.

Run as root from the repo root:  python3 bench/bench_lifecycle.py [--runs 20]
Not a test: it prints medians and 90th percentiles for the README; nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.connections import Connections  # noqa: E402
from orchestrator.inventory import load_inventory  # noqa: E402
from orchestrator.runs import LaunchSpec, RunClient  # noqa: E402
from tests.lab.lab import Lab  # noqa: E402

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def measure(client: RunClient, target, runs: int, *, command: list[str], settle: float | None,
            grace: float) -> tuple[list[float], list[float]]:
    launches, kills = [], []
    for i in range(runs):
        started = time.perf_counter()
        record = client.launch(LaunchSpec(target=target, name=f"bench{i}", command=command, settle=settle))
        launches.append(time.perf_counter() - started)
        started = time.perf_counter()
        result = client.kill(target, [record["run_id"]], grace=grace)
        kills.append(time.perf_counter() - started)
        assert result["ok"], result
    return launches, kills


def describe(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"{name:<48} median {statistics.median(values) * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   (n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Lab.start(Path(tmp) / "lab") as lab:
        inventory = load_inventory(lab.write_inventory(Path(tmp) / "inventory.yaml"))
        target = inventory.target("pve1/200")
        with Connections() as conns:
            client = RunClient(inventory, conns)
            client.launch(LaunchSpec(target=target, name="warmup", command=["true"], settle=0))  # deploy once
            rows = []
            for label, settle in (("default settle (1 s)", None), ("settle 0.1 s", 0.1)):
                launches, kills = measure(client, target, args.runs, command=["sleep", "600"], settle=settle,
                                          grace=2)
                rows.append(describe(f"launch to verified, ssh+pct, {label}", launches))
            rows.append(describe("kill to gone, workload obeys TERM", kills))
            _, stubborn = measure(client, target, max(3, args.runs // 4), command=["python3", "-c", STUBBORN],
                                  settle=0.1, grace=2)
            rows.append(describe("kill to gone, workload ignores TERM (grace 2 s)", stubborn))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
