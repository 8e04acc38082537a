"""dflashctl against plain OpenSSH on a fleet of lab hosts: `ps`, `watch --once`, `kill` and `launch` of many runs.

Run as root from the repo root:
    python3 bench/bench_fleet.py [--hosts 1,8,64] [--per-session-cost 0.1] [--rounds 3]
Not a test: it prints figures for bench/RESULTS.md; nothing here asserts a speed.

Each size builds a lab of N hosts (real sshd, the pct stand-in) with 2 running containers each, and gives every
container 1-4 runs: one long-lived (`sleep`), the others ended at once. The OpenSSH baseline does the same reads
with one `ssh HOST pct exec CT -- sh -c 'cat ...'` per target, all targets in parallel (up to 64 at a time, the
best a shell loop with `xargs -P` does): the runs' state.json and run.json for `ps`, the same plus each log's last
8 KiB for `watch --once`. Its `launch` starts a detached `sleep` with its pid in a file and reads that back, its
`kill` signals that pid and checks it is gone; dflashctl's are one `launch T... --each` and one `kill RUN...`
for the whole fleet. dflashctl and OpenSSH take turns (`--rounds` each, medians kept),
so both meet the same load. `unreachable` counts targets dflashctl could not read in any round: every target
is up, so each one is false.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lab.lab import ContainerSpec, HostSpec, Lab  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = (200, 201)
SSH_PARALLEL = 64
RUNS = "/workspace/.dflash/runs"
BASELINE = "/workspace/bench-ssh"
PS_READ = f"cat {RUNS}/*/state.json {RUNS}/*/run.json 2>/dev/null; true"
WATCH_READ = (f"cat {RUNS}/*/state.json {RUNS}/*/run.json 2>/dev/null; "
              f"for f in {RUNS}/*/train.log; do tail -c 8192 \"$f\"; done 2>/dev/null; true")
SSH_LAUNCH = (f'mkdir -p {BASELINE}/$1 && cd {BASELINE}/$1 || exit 1; setsid sleep 3600 </dev/null >log 2>&1 & '
              f'echo $! > {BASELINE}/$1/pid; sleep 0.05; kill -0 "$(cat {BASELINE}/$1/pid)"')
# gone = no such process, or a zombie (the containers' PID 1 never reaps)
SSH_KILL = (f'p=$(cat {BASELINE}/$1/pid); kill "$p"; i=0; while s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) '
            f'&& [ "$s" != Z ]; do sleep 0.05; i=$((i+1)); [ $i -gt 100 ] && exit 1; done; true')


def fleet_spec(hosts: int) -> tuple[HostSpec, ...]:
    return tuple(HostSpec(f"f{i:02d}", tuple(ContainerSpec(ct) for ct in CONTAINERS)) for i in range(hosts))


class Fleet:
    def __init__(self, lab: Lab, root: Path) -> None:
        self.lab = lab
        self.inventory = str(lab.write_inventory(root / "inventory.yaml"))
        self.targets = [f"{h}/{ct}" for h in lab.hosts for ct in CONTAINERS]
        self.env = {**os.environ, "XDG_STATE_HOME": str(root / "state"), "COLUMNS": "200"}

    def dflashctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator", "--inventory", self.inventory, *args],
                              capture_output=True, text=True, cwd=REPO, env=self.env, timeout=timeout)

    def ssh(self, target: str, script: str, *args: str) -> subprocess.CompletedProcess:
        host, ct = target.split("/")
        line = shlex.join([self.lab.hosts[host].pct_command, "exec", ct, "--", "sh", "-c", script, "sh", *args])
        return subprocess.run(self.lab.ssh_argv(host, connect_timeout=60) + [line], capture_output=True,
                              timeout=600)

    def ssh_all(self, script: str, *, per_target=lambda target: ()) -> float:
        """Wall time of `script` on every target at once (SSH_PARALLEL at a time); every one must succeed."""
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(min(SSH_PARALLEL, len(self.targets))) as pool:
            done = list(pool.map(lambda t: self.ssh(t, script, *per_target(t)), self.targets))
        took = time.perf_counter() - started
        failed = [d for d in done if d.returncode != 0]
        assert not failed, failed[0].stderr[-500:]
        return took


def timed(run) -> tuple[float, object]:
    started = time.perf_counter()
    value = run()
    return time.perf_counter() - started, value


def unread(done: subprocess.CompletedProcess, key: str) -> set[str]:
    """The targets a --json answer says could not be read (ps: `targets` with ok false; watch: `errors`)."""
    try:
        payload = json.loads(done.stdout)
    except ValueError:
        return {"<no answer: exit %d: %s>" % (done.returncode, done.stderr.strip()[-300:])}
    if key == "errors":
        return set(payload.get("errors") or {})
    return {name for name, t in (payload.get("targets") or {}).items() if not t.get("ok", True)}


def launch_each(fleet: Fleet, targets: list[str], name: str, command: list[str]) -> tuple[float, list[dict]]:
    """One `dflashctl launch T... --each` (one process for them all): wall time and the run records."""
    took, done = timed(lambda: fleet.dflashctl("launch", *targets, "--each", "--json", "--name", name, "--",
                                               *command))
    assert done.returncode == 0, done.stderr[-2000:]
    return took, json.loads(done.stdout)["runs"]


def measure(hosts: int, *, cost: float, rounds: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    started = time.perf_counter()
    with Lab.start(root / "lab", fleet_spec(hosts), session_cost=cost) as lab:
        fleet = Fleet(lab, root)
        built = time.perf_counter() - started
        print(f"  {hosts} hosts built in {built:.0f}s; seeding runs", file=sys.stderr, flush=True)
        fleet.dflashctl("ps", *fleet.targets)  # the first deploy is not what is measured
        extra = 0
        for k in range(1, 4):  # the i-th target gets i % 4 runs that ended at once, besides its live one
            chosen = [t for i, t in enumerate(fleet.targets) if i % 4 >= k]
            if chosen:
                extra += len(launch_each(fleet, chosen, f"done{k}", ["true"])[1])
        row: dict = {"hosts": hosts, "targets": len(fleet.targets), "runs": len(fleet.targets) + extra,
                     "lab_build_s": built, "unreachable": set()}
        row["launch"], records = launch_each(fleet, fleet.targets, "live", ["sleep", "3600"])
        row["ssh_launch"] = fleet.ssh_all(SSH_LAUNCH, per_target=lambda t: (t.replace("/", "-"),))
        for name, args, key, script in (("ps", ("ps", "--json"), "targets", PS_READ),
                                        ("watch", ("watch", "--once", "--json"), "errors", WATCH_READ)):
            ours, theirs = [], []
            for _ in range(rounds):
                took, done = timed(lambda: fleet.dflashctl(*args[:1], *fleet.targets, *args[1:]))
                ours.append(took)
                row["unreachable"] |= unread(done, key)
                theirs.append(fleet.ssh_all(script))
            row[name], row[f"ssh_{name}"] = statistics.median(ours), statistics.median(theirs)
        took, done = timed(lambda: fleet.dflashctl("kill", *[r["run_id"] for r in records], "--grace", "5",
                                                   "--json"))
        assert done.returncode == 0, done.stderr[-2000:]
        row["kill"] = took
        row["ssh_kill"] = fleet.ssh_all(SSH_KILL, per_target=lambda t: (t.replace("/", "-"),))
    shutil.rmtree(root, ignore_errors=True)
    return row


def show(row: dict) -> str:
    cells = [f"{row['hosts']:>5} {row['targets']:>7} {row['runs']:>5}"]
    for name in ("ps", "watch", "kill", "launch"):
        cells.append(f"{row[name]:7.2f} {row['ssh_' + name]:6.2f} {row[name] / row['ssh_' + name]:5.1f}x")
    return "  ".join(cells) + f"  {len(row['unreachable']):>5}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,8,64", help="lab sizes to measure, in hosts (2 containers each)")
    parser.add_argument("--per-session-cost", type=float, default=0.0, metavar="S",
                        help="seconds of CPU work each SSH session's login shell does on the hosts")
    parser.add_argument("--rounds", type=int, default=3, help="turns of ps and watch --once each, medians kept")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, Python {platform.python_version()}, "
          f"per-session cost {args.per_session_cost:g}s, {args.rounds} rounds", flush=True)
    print("hosts targets  runs     ps (s)  ssh  ratio   watch  ssh  ratio    kill  ssh  ratio  "
          "launch  ssh  ratio  unreachable", flush=True)
    for hosts in (int(n) for n in args.hosts.split(",")):
        row = measure(hosts, cost=args.per_session_cost, rounds=args.rounds)
        print(show(row), flush=True)
        for name in sorted(row["unreachable"]):
            print(f"    unreachable: {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
