"""`dflashctl pull` throughput against plain `ssh HOST pct exec CT -- cat FILE > out` of the same bytes, on the lab
(real sshd + pct stand-in), interleaved in one run so both meet the same machine load.

Run as root from the repo root:  python3 bench/bench_pull.py [--mb 300] [--rounds 3]
Not a test: it prints MB/s of each round, the medians and their ratio for bench/RESULTS.md. The pull is the
whole command in a process of its own (start-up, connect, finding the run on every target of the inventory, the
agent's file list, the streams with the sha256 of every byte as it arrives); plain ssh only streams. The pull's
streams alone (its JSON's transfer_s) are printed too. The checkpoint's training state is random bytes (nothing
compresses it); the pull also brings the run's few-KB files (weights stub, manifest, metrics, log).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.inventory.model import load_inventory  # noqa: E402
from orchestrator.runs.client import RunClient  # noqa: E402
from orchestrator.runs.spec import LaunchSpec  # noqa: E402
from orchestrator.transports.pool import Connections  # noqa: E402
from tests.lab.lab import Lab  # noqa: E402
from tests.lab.workloads import link_outputs_argv, write_checkpoint_dir  # noqa: E402

HOST, CTID = "pve1", 200


def make_run(lab: Lab, inventory_path: Path, mb: int) -> tuple[str, str, int]:
    """A finished run on pve1/200 whose step_1/ holds `mb` MB of training state; (run id, that file in the
    container, its size)."""
    outside = lab.hosts[HOST].containers[CTID].workspace / "bench-pull"
    state = outside / "step_1" / "training_state.pt"
    state.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(state, "wb") as sink:
        for _ in range(mb):
            block = os.urandom(2**20)
            digest.update(block)
            sink.write(block)
    write_checkpoint_dir(outside / "step_1", {"model.safetensors": b"w" * 4096})
    manifest = json.loads((outside / "step_1" / "manifest.json").read_text())
    manifest["files"]["training_state.pt"] = {"size": mb * 2**20, "sha256": digest.hexdigest()}
    (outside / "step_1" / "manifest.json").write_text(json.dumps(manifest))
    (outside / "metrics.jsonl").write_text('{"event": "step", "step": 1}\n')
    inventory = load_inventory(inventory_path)
    with Connections() as conns:
        record = RunClient(inventory, conns).launch(LaunchSpec(
            target=inventory.target(f"{HOST}/{CTID}"), name="benchpull", command=link_outputs_argv(
                "/workspace/bench-pull"), gpus=[]))
    return record.run_id, "/workspace/bench-pull/step_1/training_state.pt", mb * 2**20


def time_pull(inventory: Path, run_id: str, dest: Path) -> tuple[float, int, float]:
    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "--inventory", str(inventory), "pull", run_id,
                           "--to", str(dest), "--json"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"pull failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    return elapsed, result["bytes_transferred"], result["transfer_s"]


def time_plain(lab: Lab, path: str, out: Path) -> tuple[float, int]:
    remote = shlex.join([lab.hosts[HOST].pct_command, "exec", str(CTID), "--", "cat", path])
    started = time.perf_counter()
    with open(out, "wb") as sink:
        subprocess.run([*lab.ssh_argv(HOST), remote], stdout=sink, check=True)
    elapsed = time.perf_counter() - started
    size = out.stat().st_size
    out.unlink()
    return elapsed, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"pull": [], "ssh": [], "streams": []}
    with tempfile.TemporaryDirectory() as tmp, Lab.start(Path(tmp) / "lab") as lab:
        inventory = lab.write_inventory(Path(tmp) / "inventory.yaml")
        run_id, path, size = make_run(lab, inventory, args.mb)
        for i in range(args.rounds):
            for kind in ("pull", "ssh") if i % 2 == 0 else ("ssh", "pull"):
                streams = ""
                if kind == "pull":
                    seconds, moved, streamed = time_pull(inventory, run_id, Path(tmp) / "pulled")
                    rates["streams"].append(moved / streamed / 1e6)
                    streams = f" (its streams alone {streamed:.2f} s: {rates['streams'][-1]:.1f} MB/s)"
                else:
                    seconds, moved = time_plain(lab, path, Path(tmp) / "plain.bin")
                rates[kind].append(moved / seconds / 1e6)
                print(f"round {i + 1} {kind:<4} {moved / 1e6:7.1f} MB in {seconds:6.2f} s: "
                      f"{rates[kind][-1]:6.1f} MB/s{streams}", flush=True)
    pull, ssh = statistics.median(rates["pull"]), statistics.median(rates["ssh"])
    streams = statistics.median(rates["streams"])
    print(f"median: dflashctl pull {pull:.1f} MB/s, ssh ... pct exec ... cat {ssh:.1f} MB/s, ratio {pull / ssh:.2f}; "
          f"the pull's streams alone {streams:.1f} MB/s, ratio {streams / ssh:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
