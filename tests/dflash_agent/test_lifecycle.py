"""Launch, exit codes, detachment from the caller, lost runs: real processes inside a PID namespace."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time

from dflash_records.run import RECORD_KEYS, RunRecord
from tests.dflash_agent.pidns import AGENT_PYTHON, host_processes_with, launch, record, wait_for, wait_state

SLEEPER = ["sh", "-c", "echo started; sleep 60"]


def test_launch_is_verified_fast_and_sets_the_run_environment(container, runs_dir):
    started = time.monotonic()
    status, out = launch(container, runs_dir, "r1", ["sh", "-c", "echo id=$DFLASH_RUN_ID gpus=$CUDA_VISIBLE_DEVICES "
                                                     "x=$X; sleep 60"], "--gpus", "2,3", "--env", "X=a b",
                         settle=None)
    elapsed = time.monotonic() - started
    assert status == 0, out
    # verified once it stayed up the 1 s settle window, not at the 10 s verify timeout (a bound with room for a
    # loaded machine: 2.5 s failed at 2.77 s under load while the launch was right)
    assert elapsed < 6
    run = out["run"]
    assert (run["state"], run["run_id"], run["target"], run["gpus"]) == ("running", "r1", "lab/100", [2, 3])
    assert run["pid"] and run["supervisor_pid"] and run["exit_code"] is None
    assert wait_for(lambda: "id=r1 gpus=2,3 x=a b" in open(run["log_path"]).read(), 5)
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "r1", "--grace", "5")
    assert status == 0 and out["runs"][0]["state"] == "killed" and out["runs"][0]["signal"] == signal.SIGTERM


def test_pythonpath_is_put_before_the_inherited_one_not_instead_of_it(container, runs_dir, tmp_path):
    """The deployed trainer's directory goes first; site packages the target's environment points at stay."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    env = {**os.environ, "PYTHONPATH": "/opt/site-packages-of-the-user"}
    status, out = container.agent(
        "launch", "--runs-dir", runs_dir, "--run-id", "pp", "--name", "test", "--target", "lab/100",
        "--settle", "0.3", "--pythonpath", str(pkg), "--", "sh", "-c", "echo path=$PYTHONPATH; sleep 60", env=env)
    assert status == 0, out
    expected = "path={}:/opt/site-packages-of-the-user".format(pkg)
    assert wait_for(lambda: expected in open(out["run"]["log_path"]).read(), 5), open(out["run"]["log_path"]).read()
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "pp", "--grace", "5")[0] == 0


def test_exit_zero_is_succeeded(container, runs_dir):
    status, out = launch(container, runs_dir, "ok", ["sh", "-c", "sleep 0.6; exit 0"])
    assert status == 0, out
    run = wait_state(container, runs_dir, "ok", ("succeeded", "failed"))
    assert (run["state"], run["exit_code"], run["signal"]) == ("succeeded", 0, None)
    assert run["ended_at"] and run["started_at"]


def test_exit_three_is_failed_with_its_code(container, runs_dir):
    assert launch(container, runs_dir, "three", ["sh", "-c", "sleep 0.6; exit 3"])[0] == 0
    run = wait_state(container, runs_dir, "three", ("succeeded", "failed"))
    assert (run["state"], run["exit_code"], run["signal"]) == ("failed", 3, None)


def test_segfault_is_failed_with_the_signal(container, runs_dir):
    crash = "import os, signal, time; time.sleep(0.6); os.kill(os.getpid(), signal.SIGSEGV)"
    assert launch(container, runs_dir, "segv", [sys.executable, "-c", crash])[0] == 0
    run = wait_state(container, runs_dir, "segv", ("succeeded", "failed"))
    assert (run["state"], run["exit_code"], run["signal"]) == ("failed", None, signal.SIGSEGV)


def test_command_that_exits_at_once_fails_the_launch_with_the_log_tail(container, runs_dir):
    script = "for i in $(seq 1 60); do echo line$i; done; echo 'Traceback: boom' >&2; exit 4"
    status, out = launch(container, runs_dir, "early", ["sh", "-c", script])
    # the whole answer on failure: its run record and the supervisor's and keeper's log tails say where it stood
    assert status == 1 and out["ok"] is False and out["code"] == "run_ended", out
    assert out["exit_code"] == 4 and out["run"]["state"] == "failed", out
    assert len(out["log_tail"]) == 40 and out["log_tail"][-1] == "Traceback: boom" and out["log_tail"][0] == "line22"


def test_a_command_that_exits_at_once_is_ended_even_when_its_end_is_recorded_after_the_verify_timeout(
        container, runs_dir):
    """The supervisor records the end only once the run's leftovers are gone: here a child that ignores SIGTERM,
    ended after the 5 s grace, so the record comes after the 4 s verify timeout. The workload's own exit was
    plain to see before that timeout (its pid gone): the launch says it ended, with its exit code, instead of
    'could not be verified running'."""
    # the workload exits only once the leftover ignores TERM: a TERM before that would end it at once
    script = ("(trap '' TERM; : > \"$DFLASH_RUN_DIR/armed\"; exec sleep 60) & "
              "until [ -e \"$DFLASH_RUN_DIR/armed\" ]; do sleep 0.05; done; echo 'Traceback: boom' >&2; exit 4")
    status, out = launch(container, runs_dir, "left", ["sh", "-c", script], "--grace", "5", "--verify-timeout", "4")
    assert (status, out["code"]) == (1, "run_ended"), out
    assert (out["exit_code"], out["run"]["state"], out["log_tail"][-1]) == (4, "failed", "Traceback: boom")
    assert host_processes_with(runs_dir, "left") == []


def test_missing_program_fails_the_launch(container, runs_dir):
    status, out = launch(container, runs_dir, "nope", ["/no/such/program", "--x"])
    assert status == 1 and out["code"] == "run_ended" and out["exit_code"] == 127
    assert any("/no/such/program" in line for line in out["log_tail"])


def test_run_survives_its_callers_process_group_being_killed(container, runs_dir, tmp_path):
    """pct exec SIGKILLs what is left in its process group when the command returns."""
    out_file = tmp_path / "launch.json"
    agent = " ".join([AGENT_PYTHON, container.pyz, "launch", "--runs-dir", runs_dir, "--run-id", "pg",
                      "--name", "pg", "--target", "t", "--cwd", str(tmp_path), "--settle", "0.2", "--",
                      "sleep", "60"])
    wrapper = subprocess.Popen(container.prefix() + ["sh", "-c", agent + " > {}; sleep 60".format(out_file)],
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: out_file.exists() and out_file.read_text().strip(), 10)
        os.killpg(wrapper.pid, signal.SIGKILL)
    finally:
        wrapper.wait(timeout=10)
    time.sleep(0.5)
    run = record(container, runs_dir, "pg")
    assert run["state"] == "running"
    assert len(host_processes_with(runs_dir, "pg")) == 1
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "pg", "--grace", "2")[0] == 0


def test_launch_does_not_hold_the_callers_pipes(container, runs_dir, tmp_path):
    """pct exec does not return while a child still holds its stdout: communicate() must see EOF."""
    command = ["sh", "-c", "sleep 60 & sleep 60 & echo forked; wait"]
    started = time.monotonic()
    done = subprocess.run(container.prefix() + [AGENT_PYTHON, container.pyz, "launch", "--runs-dir", runs_dir,
                                                "--run-id", "pipe", "--name", "p", "--target", "t", "--cwd",
                                                str(tmp_path), "--settle", "0.2", "--"] + command,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=15)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 5
    assert len(host_processes_with(runs_dir, "pipe")) == 3
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "pipe", "--grace", "2")[0] == 0


def test_supervisor_killed_with_sigkill_shows_lost_and_kill_ends_the_orphans(container, runs_dir):
    status, out = launch(container, runs_dir, "sup", SLEEPER)
    assert status == 0, out
    assert container.run(["kill", "-KILL", str(out["run"]["supervisor_pid"])]).returncode == 0
    run = wait_state(container, runs_dir, "sup", ("lost",), timeout=5)
    assert run["error"]
    assert host_processes_with(runs_dir, "sup")  # the workload itself lives on, orphaned
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "sup", "--grace", "1")
    assert status == 0 and out["runs"][0]["survivors"] == [] and out["runs"][0]["state"] == "killed"
    assert host_processes_with(runs_dir, "sup") == []


def test_killing_an_ended_run_is_a_noop(container, runs_dir):
    assert launch(container, runs_dir, "done", ["sh", "-c", "sleep 0.5"])[0] == 0
    wait_state(container, runs_dir, "done", ("succeeded",))
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "done")
    assert status == 0 and out["runs"][0]["already_ended"] is True and out["runs"][0]["state"] == "succeeded"


def test_unknown_or_tricky_run_ids_for_kill_and_ps_exit_2(container, runs_dir):
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "ghost")
    assert (status, out["ok"], out["code"]) == (2, False, "unknown_run")
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "../runs")
    assert (status, out["code"]) == (2, "bad_run_id")
    status, out = container.agent("ps", "--runs-dir", runs_dir, "--run-id", "ghost")
    assert (status, out["code"]) == (2, "unknown_run")


def test_gpu_overlap_is_refused_unless_forced(container, runs_dir):
    assert launch(container, runs_dir, "g1", SLEEPER, "--gpus", "0,1")[0] == 0
    status, out = launch(container, runs_dir, "g2", SLEEPER, "--gpus", "1,2")
    assert (status, out["code"], out["busy"]) == (1, "gpus_busy", {"g1": [1]})
    assert not os.path.exists(os.path.join(runs_dir, "g2"))
    assert launch(container, runs_dir, "g3", SLEEPER, "--gpus", "2,3")[0] == 0
    assert launch(container, runs_dir, "g4", SLEEPER, "--gpus", "1", "--force")[0] == 0
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "g1", "g3", "g4", "--grace", "2")
    assert status == 0 and [r["state"] for r in out["runs"]] == ["killed"] * 3
    assert launch(container, runs_dir, "g5", ["sh", "-c", "sleep 0.3"], "--gpus", "0,1", "--settle", "0")[0] == 0


def test_a_run_with_gpus_none_sees_no_gpu_and_holds_none(container, runs_dir):
    """A notifier or a data job beside training: `--gpus none` hides every GPU from it (CUDA_VISIBLE_DEVICES set
    and empty, not unset) and neither blocks nor is blocked by runs that name GPUs; a run without --gpus still
    holds them all."""
    assert launch(container, runs_dir, "train", SLEEPER, "--gpus", "0,1")[0] == 0
    status, out = launch(container, runs_dir, "notifier",
                         ["sh", "-c", "echo visible=${CUDA_VISIBLE_DEVICES-unset}.; sleep 60"], "--gpus", "none")
    assert status == 0, out
    assert out["run"]["gpus"] == []
    assert wait_for(lambda: "visible=." in open(out["run"]["log_path"]).read(), 5)
    assert launch(container, runs_dir, "more", SLEEPER, "--gpus", "2")[0] == 0
    status, out = launch(container, runs_dir, "all", SLEEPER)
    assert (status, out["code"], out["busy"]) == (1, "gpus_busy", {"more": [2], "train": [0, 1]})
    assert "--gpus none" in out["error"]
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "train", "notifier", "more",
                                  "--grace", "2")
    assert status == 0 and [r["state"] for r in out["runs"]] == ["killed"] * 3


def test_ps_lists_every_run(container, runs_dir):
    assert launch(container, runs_dir, "a", ["sh", "-c", "sleep 0.8"])[0] == 0
    assert launch(container, runs_dir, "b", ["sh", "-c", "sleep 0.8; exit 2"])[0] == 0
    wait_state(container, runs_dir, "b", ("failed",))
    status, out = container.agent("ps", "--runs-dir", runs_dir)
    assert status == 0
    assert {r["run_id"]: r["state"] for r in out["runs"]} == {"a": "succeeded", "b": "failed"}
    # every field of the run record (the agent builds it typed), the two the controller reads from the log left
    # empty, and nothing it does not know
    assert all(set(r) == set(RECORD_KEYS) and r["last_step"] is r["tok_per_s"] is None
               for r in out["runs"])
    records = [RunRecord.from_dict(r) for r in out["runs"]]
    assert all(not r.extra and r.supervisor_pid and r.log_path and r.created_at for r in records)


def _fabricate_run(runs_dir: str, run_id: str, *, created_ts: float, state: dict) -> None:
    run_dir = os.path.join(runs_dir, run_id)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "run.json"), "w") as handle:
        json.dump({"run_id": run_id, "name": "x", "target": "t", "command": ["true"], "created_ts": created_ts}, handle)
    with open(os.path.join(run_dir, "state.json"), "w") as handle:
        json.dump(dict(state, run_id=run_id), handle)


def test_a_reused_supervisor_pid_or_a_supervisor_that_never_started_is_lost(container, runs_dir):
    """PID 1 is alive, but it is not the process that started at tick 1: the pid was reused."""
    _fabricate_run(runs_dir, "reused", created_ts=time.time(),
                   state={"state": "running", "supervisor_pid": 1, "supervisor_start_time": 1, "pid": 1})
    _fabricate_run(runs_dir, "never", created_ts=time.time() - 3600, state={"state": "starting"})
    _fabricate_run(runs_dir, "pending", created_ts=time.time(), state={"state": "starting"})
    status, out = container.agent("ps", "--runs-dir", runs_dir)
    assert status == 0
    assert {r["run_id"]: r["state"] for r in out["runs"]} == {"reused": "lost", "never": "lost", "pending": "starting"}
    with open(os.path.join(runs_dir, "reused", "state.json")) as handle:
        assert json.load(handle)["state"] == "lost"  # written, not only shown


def test_inputs_from_stdin_land_in_the_run_dir_before_the_workload_starts(container, runs_dir, tmp_path):
    config = b"lr: 0.001\nname: '$(touch x)'\n"
    packed = json.dumps({"config.yaml": base64.b64encode(config).decode()}).encode()
    argv = [AGENT_PYTHON, container.pyz, "launch", "--runs-dir", runs_dir, "--run-id", "inp", "--name", "i",
            "--target", "t", "--cwd", str(tmp_path), "--settle", "0.2", "--input", "config.yaml", "--",
            "sh", "-c", 'cat "$DFLASH_RUN_DIR/config.yaml"; sleep 0.5']
    done = subprocess.run(container.prefix() + argv, input=packed, stdout=subprocess.PIPE, timeout=20)
    out = json.loads(done.stdout)
    assert done.returncode == 0, out
    with open(os.path.join(runs_dir, "inp", "config.yaml"), "rb") as handle:
        assert handle.read() == config
    run = wait_state(container, runs_dir, "inp", ("succeeded",))
    status, out = container.agent("ps", "--runs-dir", runs_dir, "--run-id", "inp", "--tail-bytes", "13")
    assert out["runs"][0]["log_tail"] == "'$(touch x)'\n" and run["state"] == "succeeded"
    for name, data in (("run.json", packed), ("../x", packed), ("other.yaml", packed), ("config.yaml", b"{nope")):
        done = subprocess.run(container.prefix() + [a if a != "config.yaml" else name for a in argv[:-5]]
                              + ["--", "true"], input=data, stdout=subprocess.PIPE, timeout=20)
        assert done.returncode == 2, (name, done.stdout)
