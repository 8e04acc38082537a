"""Placement against `ps` on a fleet of lab hosts: how long `launch --anywhere` takes to decide where a run goes.

Run as root from the repo root:
    python3 bench/bench_place.py [--hosts 64] [--rounds 3]
Not a test: it prints figures for bench/RESULTS.md; nothing here asserts a speed.

It builds a lab of N hosts (real sshd, the pct stand-in, bench_fleet's fleet) whose 2 containers have 2 GPUs each
(the fake nvidia-smi), and starts a live run holding GPU 0 on every other container, so that some containers are
partly used and the decision has something to weigh. Then it alternates, `--rounds` times each, in the same run:
- `dflashctl ps --json` of the fleet's targets: the whole command, start-up to exit;
- `dflashctl launch --anywhere --hosts 'f*' --gpu-count 1 -- sleep 3600` (the same targets): from its start to
  the moment its `placing on ...` line reaches stderr, that is start-up, one queue call per target (the agent's
  `queue`, one session each, as ps's one `ps` call) and the decision; the launch that follows is timed apart.
Medians are kept; each placed run is killed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fleet import CONTAINERS, REPO, Fleet, timed  # noqa: E402
from tests.lab.lab import ContainerSpec, HostSpec, Lab  # noqa: E402

GPUS = 2
PLACING = "placing on "


def fleet_spec(hosts: int) -> tuple[HostSpec, ...]:
    return tuple(HostSpec(f"f{i:02d}", tuple(ContainerSpec(ct, gpus=GPUS) for ct in CONTAINERS))
                 for i in range(hosts))


def place_once(fleet: Fleet) -> tuple[float, float, str, str]:
    """One `launch --anywhere`: seconds to its placing line, seconds in all, the line, and the run id."""
    argv = [sys.executable, "-m", "orchestrator", "--inventory", fleet.inventory, "launch", "--anywhere", "--hosts",
            "f*", "--gpu-count", "1", "--name", "placed", "--", "sleep", "3600"]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=fleet.env)
    seen: dict = {}
    lines: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(PLACING) and "at" not in seen:
                seen["at"], seen["line"] = time.perf_counter() - started, line.strip()

    reader = threading.Thread(target=read_stderr)
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout=600)
    reader.join()
    took = time.perf_counter() - started
    assert proc.returncode == 0 and "at" in seen, "".join(lines)[-2000:]
    return seen["at"], took, seen["line"], out.strip()


def measure(hosts: int, *, rounds: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-place-"))
    started = time.perf_counter()
    with Lab.start(root / "lab", fleet_spec(hosts)) as lab:
        fleet = Fleet(lab, root)
        built = time.perf_counter() - started
        print(f"  {hosts} hosts built in {built:.0f}s; seeding runs", file=sys.stderr, flush=True)
        fleet.dflashctl("ps", *fleet.targets)  # the first deploy is not what is measured
        holders = fleet.targets[::2]
        done = fleet.dflashctl("launch", *holders, "--each", "--json", "--gpus", "0", "--name", "holder", "--",
                               "sleep", "3600")
        assert done.returncode == 0, done.stderr[-2000:]
        holding = [run["run_id"] for run in json.loads(done.stdout)["runs"]]
        row: dict = {"hosts": hosts, "targets": len(fleet.targets), "ps": [], "place": [], "place_all": [],
                     "lines": [], "placed": []}
        for _ in range(rounds):
            took, done = timed(lambda: fleet.dflashctl("ps", *fleet.targets, "--json"))
            assert done.returncode == 0, done.stderr[-2000:]
            row["ps"].append(took)
            decided, whole, line, run_id = place_once(fleet)
            row["place"].append(decided)
            row["place_all"].append(whole)
            row["lines"].append(line)
            row["placed"].append(run_id)
        fleet.dflashctl("kill", *row["placed"], *holding, "--grace", "1")
    shutil.rmtree(root, ignore_errors=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="64", help="lab sizes to measure, in hosts (2 containers each)")
    parser.add_argument("--rounds", type=int, default=3, help="turns of ps and of the placement each")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, Python {platform.python_version()}, {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for hosts in (int(n) for n in args.hosts.split(",")):
        row = measure(hosts, rounds=args.rounds)
        ps, place = statistics.median(row["ps"]), statistics.median(row["place"])
        print(f"hosts {row['hosts']} targets {row['targets']}: ps {ps:.2f}s, placement decided {place:.2f}s "
              f"({place / ps:.2f}x), launch --anywhere in all {statistics.median(row['place_all']):.2f}s; "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        print(f"    ps rounds {['%.2f' % t for t in row['ps']]}, placement rounds "
              f"{['%.2f' % t for t in row['place']]}", flush=True)
        for line in row["lines"]:
            print(f"    {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
