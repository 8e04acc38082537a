"""Launch-to-verified latency and kill-to-gone time on the lab (real sshd + pct stand-in), as figures.

Run as root from the repo root:  python3 bench/bench_lifecycle.py [--runs 20] [--trainer-runs 5]
Not a test: it prints medians and 90th percentiles for bench/RESULTS.md; nothing here asserts a speed.
The trainer rows launch the bundled trainer with the tiny target's config: the trainer's check on the
target, then the start (the trainer stays up importing torch well past the settle time).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.cli.launch import launch_spec  # noqa: E402
from orchestrator.inventory.model import load_inventory  # noqa: E402
from orchestrator.runs.client import RunClient  # noqa: E402
from orchestrator.runs.command import CONFIG_INPUT  # noqa: E402
from orchestrator.runs.spec import LaunchSpec, run_environment  # noqa: E402
from orchestrator.transports.pool import Connections  # noqa: E402
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
        result = client.kill(target, [record.run_id], grace=grace)
        kills.append(time.perf_counter() - started)
        assert result.ok, result
    return launches, kills


def tiny_trainer_config(root: Path) -> Path:
    """A config of the tiny target and a small dataset in its format, where the lab's containers read them."""
    import datasets
    import yaml

    from trainer.model.tiny_target import write_tiny_target

    target = write_tiny_target(root / "target", seed=0)
    lengths = [40, 60, 90] * 8
    datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths],
                                "loss_mask": [[1] * n for n in lengths]}).save_to_disk(str(root / "dataset"))
    config = {"target_path": str(target), "data_path": str(root / "dataset"), "output_dir": "out",
              "max_steps": 1000, "block_size": 8, "num_anchors": 16, "drafter_layers": 1, "token_budget": 2048,
              "buckets": [0, 128, 256, 512], "device": "cpu", "num_workers": 1, "prefetch": 2}
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def measure_trainer(client: RunClient, target, runs: int, config: Path) -> tuple[list[float], list[float]]:
    """(launch to verified of a valid trainer config, the trainer's check alone on the target)."""
    spec = launch_spec(target, [], name="benchtrain", config=config, gpus=None, env={}, force=False, grace=2)
    text, launches, checks = spec.inputs[CONFIG_INPUT], [], []
    for i in range(runs):
        started = time.perf_counter()
        client.check_trainer_config(target, text, source=str(config), run_id=f"benchcheck{i}",
                                    env=run_environment(target, {}))
        checks.append(time.perf_counter() - started)
        started = time.perf_counter()
        record = client.launch(spec)
        launches.append(time.perf_counter() - started)
        assert record.state == "running", record
        assert client.kill(target, [record.run_id], grace=2).ok
    return launches, checks


def describe(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"{name:<60} median {statistics.median(values) * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   (n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--trainer-runs", type=int, default=5)
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
            if args.trainer_runs:
                config = tiny_trainer_config(Path(tmp) / "tiny")
                launches, checks = measure_trainer(client, target, args.trainer_runs, config)
                rows.append(describe("launch to verified, valid trainer config (goal <= 2 s)", launches))
                rows.append(describe("the trainer's check alone, on the target (one round trip)", checks))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
