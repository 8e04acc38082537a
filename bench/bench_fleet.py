"""dflashctl against plain OpenSSH on a fleet of lab hosts: `ps`, `watch --once`, `kill` and `launch` of many runs.

Run as root from the repo root:
    python3 bench/bench_fleet.py [--hosts 1,8,64] [--per-session-cost 0.1] [--rounds 3]
Not a test: it prints figures for bench/RESULTS.md; nothing here asserts a speed.

Each size builds a lab of N hosts (real sshd, the pct stand-in) with 2 running containers each, and gives every
container 1-4 runs that log as the trainer does: the seed start-up lines, then HISTORY_STEPS step lines in the seed
format and their records in `$DFLASH_RUN_DIR/metrics.jsonl` (a run some hours in: 345 KiB of log, 575 KiB of
metrics), one live run that goes on adding a step to both every second, the others ended once written. The
OpenSSH baseline does the same reads with one `ssh HOST pct exec CT -- sh -c 'cat ...'` per target, all targets in
parallel (up to 64 at a time, the best a shell loop with `xargs -P` does): the runs' state.json and run.json for
`ps`, the same plus the last 8 KiB of each log and of each metrics.jsonl for `watch --once`. Its `launch` starts
a detached `sleep` with its pid in a file and reads that back, its
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

from dflash_records.step import StepRecord  # noqa: E402
from tests.lab.lab import ContainerSpec, HostSpec, Lab  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = (200, 201)
SSH_PARALLEL = 64
RUNS = "/workspace/.dflash/runs"
BASELINE = "/workspace/bench-ssh"
PS_READ = f"cat {RUNS}/*/state.json {RUNS}/*/run.json 2>/dev/null; true"
WATCH_READ = (f"cat {RUNS}/*/state.json {RUNS}/*/run.json 2>/dev/null; "
              f"for f in {RUNS}/*/train.log {RUNS}/*/metrics.jsonl; do tail -c 8192 \"$f\"; done 2>/dev/null; true")
SSH_LAUNCH = (f'mkdir -p {BASELINE}/$1 && cd {BASELINE}/$1 || exit 1; setsid sleep 3600 </dev/null >log 2>&1 & '
              f'echo $! > {BASELINE}/$1/pid; sleep 0.05; kill -0 "$(cat {BASELINE}/$1/pid)"')
# gone = no such process, or a zombie (the containers' PID 1 never reaps)
SSH_KILL = (f'p=$(cat {BASELINE}/$1/pid); kill "$p"; i=0; while s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) '
            f'&& [ "$s" != Z ]; do sleep 0.05; i=$((i+1)); [ $i -gt 100 ] && exit 1; done; true')


HISTORY_STEPS = 2000
SEED_STARTUP = (REPO / "tests" / "lab" / "fixtures" / "logs" / "seed_startup.log").read_text()
STEP_MARK = 987654321  # replaced by each step's number in the workload
# A trainer's logging, in the container's own Python: its start-up lines, HISTORY_STEPS steps at once (the run so
# far), then, if live, a step a second; each step one line of train.log and one record of metrics.jsonl.
TRAINER_LIKE = """import os, sys, time
startup, line, record, steps, live = sys.argv[1:]
metrics = open(os.path.join(os.environ["DFLASH_RUN_DIR"], "metrics.jsonl"), "a")
def step(i):
    sys.stdout.write(line.replace("%d", str(i)) + "\\n")
    metrics.write(record.replace("%d", str(i)) + "\\n")
sys.stdout.write(startup)
i = 0
while i < int(steps) or live == "1":
    i += 1
    step(i)
    if live == "1" and i >= int(steps):
        sys.stdout.flush(); metrics.flush(); time.sleep(1)
""" % (STEP_MARK, STEP_MARK)


def trainer_like(live: bool) -> list[str]:
    """The command of a run that logs like the trainer (TRAINER_LIKE), with the seed format's step line and its
    exact record."""
    record = StepRecord(elapsed_s=3 * 3600 + 420, step=STEP_MARK, loss=2.4817, acc=0.3125, streak=1.4,
                        lr=4.52e-06, noise=0.0003, tgt_batches_per_s=0.35, dft_batches_per_s=0.29,
                        tok_per_s=11734.5, q_pre=(50, 50, 50, 49, 50), q_hs=(15,), epoch=0.21, eta_s=11.9 * 86400)
    return ["python3", "-c", TRAINER_LIKE, SEED_STARTUP, record.to_line(), record.to_json(), str(HISTORY_STEPS),
            "1" if live else "0"]


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
                extra += len(launch_each(fleet, chosen, f"done{k}", trainer_like(live=False))[1])
        row: dict = {"hosts": hosts, "targets": len(fleet.targets), "runs": len(fleet.targets) + extra,
                     "lab_build_s": built, "unreachable": set()}
        row["launch"], records = launch_each(fleet, fleet.targets, "live", trainer_like(live=True))
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
