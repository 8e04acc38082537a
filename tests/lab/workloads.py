"""Workloads and paths shared by the tests that run things in lab containers and watch them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.inventory.model import Inventory, load_inventory
from orchestrator.runs.spec import runs_dir
from tests.polling import wait_for

STEP = ("[{i}s] step={i} loss=2.5 acc=0.1 streak=0.5 lr=1e-4 noise=0.0 | tgt=1.0b/s dft=1.0b/s (11.7Ktok/s) | "
        "q_pre=[5] q_hs=[2] | epoch~0.01 ETA=1h")
# a run that says `up` and ends when its gate is opened (Lab.open_gate): a GPU holder a test ends when it likes
GATED = "echo up; while [ ! -e /workspace/gate/$DFLASH_RUN_ID ]; do sleep 0.05; done"
QUIET = "import time; print('Loading dataset from /data...', flush=True); time.sleep(3600)"
TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    step()\n'
             'RuntimeError: {message}\n')

# holds a lock directory for as long as it runs (a second copy finds it taken, says so and fails) and lets it go
# on SIGTERM: two copies of one run training into the same output directory at once show
LOCK_HOLDER = """
import os, signal, sys, time
lock = sys.argv[1]
try:
    os.mkdir(lock)
except FileExistsError:
    open(lock + ".double", "w").write("a second copy started while the first ran")
    sys.exit(3)
def leave(*_):
    os.rmdir(lock)
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
print("holding", lock, sys.argv[2:], flush=True)
while True:
    time.sleep(0.1)
"""


def counter(period_s: float = 0.1) -> str:
    """A workload printing numbered step lines for as long as it runs: each must arrive exactly once."""
    return ("import time\ni = 0\nwhile True:\n    i += 1\n    print(" + repr(STEP) + ".format(i=i), flush=True)\n"
            f"    time.sleep({period_s})")


def quick_inventory(lab, path: Path) -> Inventory:
    """The lab's inventory with a 2 s connect timeout: a dead link costs each reconnect attempt 2 s, not 10."""
    lab.write_inventory(path)
    path.write_text(path.read_text().replace("defaults: {", "defaults: {connect_timeout: 2, ", 1))
    return load_inventory(path)


def fresh_workdir(lab, path: Path, tag: str) -> Path:
    """quick_inventory with a workdir of its own on pve2/300 (a first deploy happens there); where that workdir
    is, seen from outside the container."""
    quick_inventory(lab, path)
    workdir = f"/workspace/{tag}-{os.getpid()}-{time.monotonic_ns()}"
    path.write_text(path.read_text().replace("300: {gpus: 1}", f"300: {{gpus: 1, workdir: {workdir}}}"))
    return lab.hosts["pve2"].containers[300].workspace / workdir.removeprefix("/workspace/")


def log_path(lab, inventory: Inventory, host: str, ctid: int, run_id: str) -> Path:
    """Where a run's train.log is, seen from outside the container."""
    inside = runs_dir(inventory.target(f"{host}/{ctid}"))
    return lab.hosts[host].containers[ctid].workspace / inside.removeprefix("/workspace/") / run_id / "train.log"


def run_cli(inv: str, *args: str, capsys) -> tuple[int, dict | str, str]:
    """`dflashctl --inventory INV ARGS...` in-process: exit code, stdout (parsed when it is JSON), stderr."""
    import json

    from orchestrator.cli import main

    code = main(["--inventory", inv, *args])
    out = capsys.readouterr()
    try:
        return code, json.loads(out.out), out.err
    except ValueError:
        return code, out.out, out.err


def write_local_inventory(path: Path, workdir: Path) -> str:
    """An inventory of the `local` target alone, working in `workdir` with this interpreter; its path."""
    path.write_text("hosts:\n  local:\n    transport: local\n"
                    f"    workdir: {json.dumps(str(workdir))}\n    python: {json.dumps(sys.executable)}\n")
    return str(path)


def stop_keeper(runs: Path) -> None:
    """TERM the keeper that a test's launches on `local` started for `runs` (it outlives the test otherwise);
    only when /proc still shows that keeper, never a process that reused its pid."""
    try:
        pid = int(json.loads((runs / ".keeper" / "keeper.json").read_text())["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError):
        return
    if b"keeper" in cmdline and os.fsencode(str(runs.resolve())) in cmdline:
        os.kill(pid, signal.SIGTERM)


def zombie_children(pid: int) -> list:
    """Host pids of the zombies `pid` holds (children it has not reaped)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for child in children:
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                found.append(int(child))
        except OSError:
            continue
    return found


def start_foreign_stuck_parent() -> subprocess.Popen:
    """What another container's PID 1 looks like from the host: `sleep 301`, which never reaps, holding one
    zombie. No run owns it: cleanup must leave it alone. The caller kills and waits for it."""
    proc = subprocess.Popen(["sh", "-c", "sleep 0.1 & exec sleep 301"], start_new_session=True)
    if not wait_for(lambda: zombie_children(proc.pid), 5):
        proc.kill()
        proc.wait()
        raise AssertionError("the foreign zombie did not appear")
    return proc


@contextmanager
def slow_link(lab, host: str) -> Iterator[None]:
    """Traffic towards `host` at ~8 KB/s (tc tbf on its root-side veth) while the block runs: an upload then
    takes seconds, long enough to cut it mid-way. Skips the test where this kernel cannot shape a link."""
    import pytest

    veth = lab.hosts[host].link.root_veth
    shaped = subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", "64kbit", "burst", "1600",
                             "latency", "2s"], capture_output=True, text=True)
    if shaped.returncode != 0:
        pytest.skip(f"this kernel cannot slow a link (tc tbf): {shaped.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False, capture_output=True)


# a run that made what the bundled trainer makes: metrics.jsonl in its output_dir, linked into the run directory
LINK_OUTPUTS = 'ln -s "$1/metrics.jsonl" "$DFLASH_RUN_DIR/metrics.jsonl"; echo "outputs in $1"'


def link_outputs_argv(output_dir: str) -> list[str]:
    """The command of a run whose output_dir (as the container sees it) holds checkpoints already."""
    return ["sh", "-c", LINK_OUTPUTS, "sh", output_dir]


def write_checkpoint_dir(step_dir: Path, files: dict[str, bytes]) -> Path:
    """step_N/ with these files and the manifest.json a save ends with (sizes and sha256)."""
    import hashlib

    step_dir.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, data in files.items():
        (step_dir / name).write_bytes(data)
        manifest[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps({"version": 1, "files": manifest}))
    return step_dir
