"""The keeper leaves once it has had nothing to do for its idle time, and never while a launch needs it."""
from __future__ import annotations

import json
import os
import random
import time

from tests.dflash_agent.pidns import AGENT_PYTHON, launch, record, wait_for, wait_state


def _keeper(runs_dir: str) -> dict:
    with open(os.path.join(runs_dir, ".keeper", "keeper.json")) as handle:
        return json.load(handle)


def _alive(pid: int) -> bool:
    try:
        with open("/proc/{}/stat".format(pid), "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _host_pid(container, pid_in_ns: int) -> int | None:
    """The host pid of the namespace's process `pid_in_ns` (keeper.json records the namespace's pid)."""
    for name in os.listdir("/proc"):
        try:
            if os.readlink("/proc/{}/ns/pid".format(name)) != container.ns_link:
                continue
            with open("/proc/{}/status".format(name)) as handle:
                nspid = next(line for line in handle if line.startswith("NSpid:")).split()[-1]
        except (OSError, StopIteration):
            continue
        if int(nspid) == pid_in_ns:
            return int(name)
    return None


def test_the_keeper_exits_after_its_idle_time_once_the_last_run_ended(container, runs_dir):
    # the run ends when the test says so, not after a fixed sleep a loaded machine could outlast
    release = os.path.join(os.path.dirname(runs_dir), "release-short")
    status, out = launch(container, runs_dir, "short",
                         ["sh", "-c", "while [ ! -e {} ]; do sleep 0.1; done".format(release)], "--keeper-idle", "1")
    assert status == 0, out
    keeper = _host_pid(container, _keeper(runs_dir)["pid"])
    assert keeper and _alive(keeper)
    time.sleep(1.5)  # idle time passed, but a run is still live: the keeper stays
    assert record(container, runs_dir, "short")["state"] == "running" and _alive(keeper)
    open(release, "w").close()
    wait_state(container, runs_dir, "short", ("succeeded",))
    assert wait_for(lambda: not _alive(keeper), 5), "keeper still up after its idle time"
    assert wait_for(lambda: container.zombies() == [], 5)  # its parent is outside: the host's init reaps it


def test_a_keeper_that_stays_does_not_leave(container, runs_dir):
    status, out = launch(container, runs_dir, "long", ["sleep", "60"], "--keeper-idle", "600")
    assert status == 0, out
    keeper = _host_pid(container, _keeper(runs_dir)["pid"])
    container.agent("kill", "--runs-dir", runs_dir, "--run-id", "long", "--grace", "1")
    time.sleep(1.5)
    assert _alive(keeper)  # 600 s of idle time are far from over
    os.kill(keeper, 15)


def test_launches_that_meet_a_leaving_keeper_are_all_started(container, runs_dir):
    """Idle time 0.1 s: the keeper leaves between almost every two launches; none may be lost."""
    rng = random.Random(7)
    ids = []
    for i in range(12):
        run_id = "race{}".format(i)
        status, out = launch(container, runs_dir, run_id, ["sh", "-c", "sleep 0.2"], "--keeper-idle", "0.1",
                             settle="0")
        assert status == 0, out
        ids.append(run_id)
        time.sleep(rng.choice([0.0, 0.05, 0.15, 0.3, 0.5]))
    for run_id in ids:
        assert wait_state(container, runs_dir, run_id, ("succeeded", "failed", "lost"))["state"] == "succeeded"
    assert wait_for(lambda: _host_pid(container, _keeper(runs_dir)["pid"]) is None, 5)  # the last one left too
    with open(os.path.join(runs_dir, ".keeper", "keeper.log")) as handle:
        assert handle.read().count("exiting") >= 3  # launches did meet keepers that had left or were leaving
    assert wait_for(lambda: container.zombies() == [], 5)


def _zombie_findings(ns, runs_dir: str) -> list:
    status, out = ns.agent("cleanup", "--runs-dir", runs_dir)
    assert status == 0, out
    return [f for f in out["findings"] if "zombies" in f["kind"]] + out["foreign_zombies"]


def test_a_keeper_that_leaves_leaves_no_zombie_under_a_non_reaping_init(fresh_bad_init_container, runs_dir):
    """Launched as pct exec launches (from a parent outside the container), the keeper's parent is that outside
    process and then the host's init, never the container's PID 1 that does not reap: its exit leaves nothing."""
    ns = fresh_bad_init_container
    # up long enough to be verified on a loaded machine (0.5 s once ended inside the 0.3 s settle window)
    status, out = launch(ns, runs_dir, "brief", ["sleep", "2"], "--keeper-idle", "1")
    assert status == 0, out
    keeper = _host_pid(ns, _keeper(runs_dir)["pid"])
    wait_state(ns, runs_dir, "brief", ("succeeded",))
    assert wait_for(lambda: not _alive(keeper), 10), "keeper still up after its idle time"
    assert wait_for(lambda: ns.zombies() == [], 5), ns.zombies()
    assert _zombie_findings(ns, runs_dir) == []


def test_a_keeper_whose_parent_is_a_non_reaping_init_stays_rather_than_leave_a_zombie(fresh_bad_init_container,
                                                                                      runs_dir):
    """Launched from inside the container (a shell there is the agent's parent), the keeper is PID 1's child;
    that PID 1 never reaps, so leaving would leave a zombie for good: it stays, and says so in its log."""
    ns = fresh_bad_init_container
    done = ns.run(["sh", "-c", '"$@"; exit $?', "sh", AGENT_PYTHON, ns.pyz, "launch", "--runs-dir", runs_dir,
                   "--run-id", "inside", "--name", "test", "--target", "lab/100", "--cwd", os.path.dirname(runs_dir),
                   "--settle", "0.1", "--keeper-idle", "0.5", "--", "sleep", "0.5"])
    assert done.returncode == 0, done.stdout + done.stderr
    keeper = _host_pid(ns, _keeper(runs_dir)["pid"])
    with open("/proc/{}/status".format(keeper)) as handle:
        assert "PPid:\t{}\n".format(ns.init_pid) in handle.read()
    wait_state(ns, runs_dir, "inside", ("succeeded",))
    log = os.path.join(runs_dir, ".keeper", "keeper.log")
    assert wait_for(lambda: "staying" in open(log).read(), 10), open(log).read()
    assert _alive(keeper) and ns.zombies() == [] and _zombie_findings(ns, runs_dir) == []
