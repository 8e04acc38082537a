"""What a launch answers at its verify deadline, on real run files: the races between its last look and its verdict."""
from __future__ import annotations

import os

from dflash_agent import keeper, procfs
from dflash_agent.launch import wait_verified
from dflash_agent.rundir import RunPaths, write_json_atomic
from dflash_agent.runstate import read_state, update_state


def _starting_run(runs_dir: str) -> RunPaths:
    paths = RunPaths(runs_dir, "late")
    os.makedirs(paths.dir)
    write_json_atomic(paths.run_json, {"version": 1, "run_id": "late", "command": ["true"]})
    write_json_atomic(paths.state_json, {"version": 1, "run_id": "late", "state": "starting"})
    return paths


def test_a_launch_that_gives_up_never_marks_lost_a_run_its_supervisor_claimed_meanwhile(tmp_path, monkeypatch):
    """The keeper had already taken the spawn request, so cancelling it is too late, and the supervisor claims the
    run between the launch's last read and its verdict: the run is that supervisor's now (it starts the workload
    and records its end), so the launch may not write `lost` over it and answers unverified instead."""
    paths = _starting_run(str(tmp_path))

    def claimed_meanwhile(runs_dir: str, run_id: str) -> bool:
        me = os.getpid()  # a live process stands in for the supervisor
        update_state(paths, lambda state: dict(state, supervisor_pid=me, supervisor_start_time=procfs.start_time(me)))
        return False  # the request was gone already

    monkeypatch.setattr(keeper, "cancel_spawn", claimed_meanwhile)
    assert wait_verified(paths, timeout=0, settle=1) == "unverified"
    assert read_state(paths)["state"] == "starting" and read_state(paths)["supervisor_pid"] == os.getpid()


def test_a_run_no_supervisor_claimed_by_the_deadline_is_lost_and_its_spawn_cancelled(tmp_path):
    paths = _starting_run(str(tmp_path))
    request = keeper.KeeperPaths(str(tmp_path)).request("late")
    os.makedirs(os.path.dirname(request))
    write_json_atomic(request, {"version": 1, "argv": ["true"], "env": {}, "log": os.devnull})
    assert wait_verified(paths, timeout=0, settle=1) == "ended"
    state = read_state(paths)
    assert (state["state"], state["error"]) == ("lost", "the supervisor did not start in time")
    assert not os.path.exists(request)
