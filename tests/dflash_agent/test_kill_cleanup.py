"""kill ends whole process trees; cleanup reaps, ends orphans, marks lost runs and reports the unfixable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.dflash_agent.pidns import host_processes_with, launch, record, wait_for, wait_state

TREE = """
import os, signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('ignoring', flush=True); time.sleep(300)"])
child = os.fork()
if child == 0:
    if os.fork() == 0:
        os.setsid()
        print("escaped", flush=True)
        time.sleep(300)
    os._exit(0)
os.waitpid(child, 0)
print("tree up", flush=True)
time.sleep(300)
"""

STUCK_PARENT = """
import os, sys, time
for _ in range(3):
    if os.fork() == 0:
        os._exit(0)
print("planted", flush=True)
time.sleep(300)
"""


def plant_stuck_parent(ns) -> subprocess.Popen:
    """A process no run owns whose three children exit and which never waits for them: three zombies."""
    before = len(ns.zombies())
    parent = ns.popen([sys.executable, "-c", STUCK_PARENT], stdout=subprocess.PIPE)
    assert parent.stdout.readline().strip() == b"planted"
    assert wait_for(lambda: len(ns.zombies()) >= before + 3, 5)
    return parent


def gone(ns, pid: int) -> bool:
    return ns.run(["test", "-e", "/proc/{}".format(pid)]).returncode != 0


def left_by_a_dead_supervisor(ns, runs_dir: str, run_id: str, *, keeper_too: bool = False) -> int:
    """A run whose supervisor was SIGKILLed (by the OOM killer, say) while its workload, a stuck parent of three
    zombies, lives on: a real leftover of the run, not a process that merely sets DFLASH_RUN_ID. With
    `keeper_too` the keeper goes as well, so the workload falls to the namespace's PID 1. Returns the
    workload's pid (the namespace's numbering)."""
    before = len(ns.zombies())
    status, out = launch(ns, runs_dir, run_id, [sys.executable, "-c", STUCK_PARENT], settle="0.1")
    assert status == 0, out
    assert wait_for(lambda: len(ns.zombies()) >= before + 3, 5)
    run = record(ns, runs_dir, run_id)
    assert ns.run(["kill", "-KILL", str(run["supervisor_pid"])]).returncode == 0
    assert wait_for(lambda: gone(ns, run["supervisor_pid"]), 5)  # reaped by the keeper
    if keeper_too:
        with open(os.path.join(runs_dir, ".keeper", "keeper.json")) as handle:
            keeper = json.load(handle)["pid"]
        assert ns.run(["kill", "-KILL", str(keeper)]).returncode == 0
        assert wait_for(lambda: gone(ns, keeper), 5)
    return run["pid"]


def stop(parent: subprocess.Popen) -> None:
    if parent.poll() is None:
        parent.kill()
    parent.wait()
    parent.stdout.close()


def test_kill_ends_the_whole_tree_within_the_grace(bad_init_container, runs_dir, tmp_path):
    ns = bad_init_container
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    assert launch(ns, runs_dir, "tree", [sys.executable, str(script)])[0] == 0
    log = os.path.join(runs_dir, "tree", "train.log")
    assert wait_for(lambda: all(w in open(log).read() for w in ("ignoring", "escaped", "tree up")), 10)
    assert len(host_processes_with(runs_dir, "tree")) == 4  # main, sleeper, TERM-ignorer, escaped
    started = time.monotonic()
    status, out = ns.agent("kill", "--runs-dir", runs_dir, "--run-id", "tree", "--grace", "2")
    elapsed = time.monotonic() - started
    result = out["runs"][0]
    assert status == 0 and result["ok"] and result["survivors"] == [], out
    assert (result["state"], result["signal"]) == ("killed", signal.SIGTERM)
    assert 1.9 <= elapsed < 6  # the TERM-ignoring child holds it for the whole grace, then SIGKILL
    assert host_processes_with(runs_dir) == []
    assert ns.zombies() == []


@pytest.mark.slow
def test_twenty_launch_kill_cycles_leave_no_zombie_under_a_non_reaping_init(bad_init_container, runs_dir):
    ns = bad_init_container
    for i in range(20):
        run_id = "c{}".format(i)
        status, out = launch(ns, runs_dir, run_id, ["sh", "-c", "sleep 60 & exec sleep 60"], settle="0.1")
        assert status == 0, out
        status, out = ns.agent("kill", "--runs-dir", runs_dir, "--run-id", run_id, "--grace", "2")
        assert status == 0 and out["runs"][0]["state"] == "killed", out
    assert host_processes_with(runs_dir) == []
    assert ns.zombies() == []


def test_cleanup_reaps_zombies_by_ending_the_stuck_parent_an_ended_run_left(container, runs_dir):
    parent = left_by_a_dead_supervisor(container, runs_dir, "gone")
    status, out = container.agent("cleanup", "--runs-dir", runs_dir, "--dry-run")
    assert status == 0 and out["dry_run"] is True
    planned = [a for a in out["actions"] if a["action"] == "end_stuck_parent"]
    assert len(planned) == 1 and len(planned[0]["zombies"]) == 3 and planned[0]["done"] is False
    assert planned[0]["run_id"] == "gone" and out["foreign_zombies"] == []
    assert not gone(container, parent) and len(container.zombies()) == 3  # dry run changed nothing
    status, out = container.agent("cleanup", "--runs-dir", runs_dir)
    done = [a for a in out["actions"] if a["action"] == "end_stuck_parent"]
    assert status == 0 and out["ok"], out
    assert done[0]["done"] and done[0]["ok"] and done[0]["reaped"] == 3
    assert wait_for(lambda: gone(container, parent), 5)
    assert container.zombies() == []


def test_cleanup_never_ends_a_stuck_parent_no_run_owns(container, runs_dir):
    """Zombies of a process that is not ours (another program; on a host, another container's PID 1) are
    reported under foreign_zombies, and their parent is left running, dry run or not."""
    assert launch(container, runs_dir, "beside", ["sleep", "60"])[0] == 0
    parent = plant_stuck_parent(container)
    try:
        for dry in (["--dry-run"], []):
            status, out = container.agent("cleanup", "--runs-dir", runs_dir, *dry)
            assert status == 0 and out["ok"] and out["actions"] == [], out
            foreign = out["foreign_zombies"]
            assert len(foreign) == 1 and foreign[0]["count"] == 3 and len(foreign[0]["pids"]) == 3, out
            assert "planted" in foreign[0]["parent"]["cmdline"]
            assert "left alone" in foreign[0]["description"] and "restart" in foreign[0]["advice"]
            assert parent.poll() is None and len(container.zombies()) == 3
        assert out["live_runs"] == ["beside"] and record(container, runs_dir, "beside")["state"] == "running"
    finally:
        stop(parent)
        container.agent("kill", "--runs-dir", runs_dir, "--run-id", "beside", "--grace", "1")


def test_zombies_of_a_non_reaping_init_are_reported_not_hidden(fresh_bad_init_container, runs_dir):
    ns = fresh_bad_init_container
    left_by_a_dead_supervisor(ns, runs_dir, "gone", keeper_too=True)
    status, out = ns.agent("cleanup", "--runs-dir", runs_dir)
    assert status == 0, out
    action = [a for a in out["actions"] if a["action"] == "end_stuck_parent"][0]
    assert action["ok"] and action["reaped"] == 0 and len(action["still_zombies"]) == 3
    status, out = ns.agent("cleanup", "--runs-dir", runs_dir)
    finding = [f for f in out["findings"] if f["kind"] == "zombies_of_init"][0]
    # the three it held, and the stuck parent itself: PID 1 inherited them all and never reaps
    assert set(action["still_zombies"]) < set(finding["pids"]) and finding["count"] == 4
    assert "restart" in finding["advice"] and "/dev/shm" in finding["advice"]
    assert out["actions"] == []  # nothing left that cleanup could do


def test_cleanup_ends_orphans_of_ended_runs_and_marks_dead_runs_lost(container, runs_dir):
    """Only processes tied to a run by lineage are ended; ones that merely set DFLASH_RUN_ID (anyone can) are
    reported and left alone, whether the run they name has ended or never existed."""
    assert launch(container, runs_dir, "ended", ["sh", "-c", "sleep 0.8"])[0] == 0
    wait_state(container, runs_dir, "ended", ("succeeded",))
    assert launch(container, runs_dir, "dead", ["sleep", "60"])[0] == 0
    assert launch(container, runs_dir, "alive", ["sleep", "60"])[0] == 0
    container.run(["kill", "-KILL", str(record(container, runs_dir, "dead")["supervisor_pid"])])
    other_dir = runs_dir + "-other"
    strays = [container.popen(["env", "DFLASH_RUN_ID=" + rid, "DFLASH_RUNS_DIR=" + rdir, "sleep", "60"])
              for rid, rdir in (("ended", runs_dir), ("ghost", runs_dir), ("ended", other_dir))]
    try:
        assert wait_for(lambda: len(host_processes_with(runs_dir)) == 4, 5)
        status, out = container.agent("cleanup", "--runs-dir", runs_dir, "--dry-run")
        planned = sorted((a["action"], a.get("run_id")) for a in out["actions"])
        assert planned == [("end_orphan", "dead"), ("mark_lost", "dead")]
        assert not any(a["done"] for a in out["actions"])
        claims = [f for f in out["findings"] if f["kind"] == "unproven_run_processes"]
        assert len(claims) == 1 and len(claims[0]["pids"]) == 2 and "left alone" in claims[0]["description"]
        with open(os.path.join(runs_dir, "dead", "state.json")) as handle:
            assert json.load(handle)["state"] == "running"  # dry run wrote nothing (ps would mark it lost)
        status, out = container.agent("cleanup", "--runs-dir", runs_dir)
        assert sorted((a["action"], a.get("run_id")) for a in out["actions"]) == planned
        assert all(a["done"] and a["ok"] for a in out["actions"])
        assert status == 0 and out["ok"] and out["live_runs"] == ["alive"]
        assert record(container, runs_dir, "dead")["state"] == "lost"
        assert all(stray.poll() is None for stray in strays)  # never ended: nothing ties them to a run
        assert len(host_processes_with(runs_dir)) == len(host_processes_with(runs_dir, "alive")) + 2
        assert len(host_processes_with(other_dir)) == 1  # another runs directory is not ours to touch
    finally:
        for stray in strays:
            stray.kill()
            stray.wait()
        container.agent("kill", "--runs-dir", runs_dir, "--run-id", "alive", "--grace", "1")


def test_cleanup_reports_gpu_memory_held_while_no_run_is_live(container, runs_dir, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0, 19603, 0\\n1, 0, 0\\n2, [N/A], [N/A]\\n'\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]))
    status, out = container.agent("cleanup", "--runs-dir", runs_dir, env=env)
    assert status == 0 and out["gpus"]["available"]
    assert [g["index"] for g in out["gpus"]["gpus"]] == [0, 1, 2]
    held = [f for f in out["findings"] if f["kind"] == "gpu_memory_held"]
    assert len(held) == 1 and held[0]["gpus"] == [{"index": 0, "memory_used_mib": 19603, "utilization_pct": 0}]
    assert launch(container, runs_dir, "ongpu0", ["sleep", "60"], "--gpus", "0")[0] == 0
    status, out = container.agent("cleanup", "--runs-dir", runs_dir, env=env)
    assert [f for f in out["findings"] if f["kind"] == "gpu_memory_held"] == []
    container.agent("kill", "--runs-dir", runs_dir, "--run-id", "ongpu0", "--grace", "1")


def test_kill_ends_the_run_itself_when_the_supervisor_is_stuck(container, runs_dir):
    status, out = launch(container, runs_dir, "stuck", ["sh", "-c", "sleep 60 & exec sleep 60"])
    assert status == 0, out
    assert container.run(["kill", "-STOP", str(out["run"]["supervisor_pid"])]).returncode == 0
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "stuck", "--grace", "0.5")
    result = out["runs"][0]
    assert status == 0 and result["survivors"] == [] and result["state"] == "killed", out
    assert any("leftover" in action for action in result["actions"])
    assert host_processes_with(runs_dir) == []
    assert record(container, runs_dir, "stuck")["state"] == "killed"
