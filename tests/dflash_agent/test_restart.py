"""Runs that heal themselves: the supervisor's restart policy, hang watchdog and crash-loop guard, with real
processes and signals inside a PID namespace standing in for a container (short backoffs keep them quick)."""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

from tests.lab.workloads import LOCK_HOLDER
from tests.dflash_agent.pidns import Namespace, launch, record, wait_for, wait_state

TERMINAL = ("succeeded", "failed", "killed", "lost")


def flaky(tmp_path, *, failures: int, line: str = "RuntimeError: boom {n}") -> list:
    """A workload that fails `failures` times (exit 3, printing `line` with its attempt number), then succeeds;
    each attempt counts itself in a file and prints the arguments it got."""
    script = tmp_path / "flaky.sh"
    script.write_text(textwrap.dedent("""\
        n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
        echo "attempt $n args: $*"
        sleep 0.5
        [ $n -gt {failures} ] && exit 0
        echo "{line}"; exit 3
        """).format(count=tmp_path / "count", failures=failures, line=line.replace("{n}", "$n")))
    return ["sh", str(script)]


def attempts_made(tmp_path) -> int:
    path = tmp_path / "count"
    return int(path.read_text()) if path.exists() else 0


def test_a_workload_failing_twice_then_succeeding_ends_succeeded_after_three_attempts(container, runs_dir, tmp_path):
    status, out = launch(container, runs_dir, "heal", flaky(tmp_path, failures=2), "--restart", "on-failure:4",
                         "--restart-backoff", "0.2", "--retry-arg=--resume", "--retry-arg=auto")
    assert status == 0, out
    run = wait_state(container, runs_dir, "heal", TERMINAL, timeout=20)
    assert (run["state"], run["exit_code"], run["attempt"], run["max_attempts"]) == ("succeeded", 0, 3, 5)
    assert [(a["attempt"], a["exit_code"], a["reason"]) for a in run["attempts"]] == [
        (1, 3, "failed"), (2, 3, "failed"), (3, 0, "exited")]
    assert [a["exception"] for a in run["attempts"]] == ["RuntimeError: boom 1", "RuntimeError: boom 2", None]
    assert all(a["started_at"] and a["ended_at"] for a in run["attempts"])
    log = open(run["log_path"]).read()
    # the first attempt runs the command as given, a restarted one with the retry arguments
    assert "attempt 1 args: \n" in log and "attempt 2 args: --resume auto" in log and "attempt 3 args: --resume auto" in log
    assert "dflash: attempt 1/5 failed with exit code 3 (RuntimeError: boom 1); restarting in 0.2s" in log
    assert "restarting in 0.4s" in log  # the backoff doubles


def test_without_a_policy_a_failure_is_final(container, runs_dir, tmp_path):
    assert launch(container, runs_dir, "once", flaky(tmp_path, failures=2))[0] == 0
    run = wait_state(container, runs_dir, "once", TERMINAL, timeout=10)
    assert (run["state"], run["exit_code"], run["attempt"], run["restart_policy"]) == ("failed", 3, 1, "never")
    assert attempts_made(tmp_path) == 1


def test_the_restarts_are_bounded_by_n(container, runs_dir, tmp_path):
    # a different exception each time: no crash loop, only the count ends it
    assert launch(container, runs_dir, "bounded", flaky(tmp_path, failures=9), "--restart", "on-failure:1",
                  "--restart-backoff", "0.1")[0] == 0
    run = wait_state(container, runs_dir, "bounded", TERMINAL, timeout=15)
    assert (run["state"], run["exit_code"], len(run["attempts"])) == ("failed", 3, 2)
    assert attempts_made(tmp_path) == 2


def test_the_same_failure_three_times_without_progress_is_a_crash_loop(container, runs_dir, tmp_path):
    assert launch(container, runs_dir, "loop", flaky(tmp_path, failures=99, line="torch.OutOfMemoryError: CUDA out"),
                  "--restart", "on-failure:10", "--restart-backoff", "0.1")[0] == 0
    run = wait_state(container, runs_dir, "loop", TERMINAL, timeout=20)
    assert (run["state"], run["reason"], len(run["attempts"])) == ("failed", "crash loop", 3)
    assert run["error"] == "crash loop: torch.OutOfMemoryError: CUDA out"
    assert attempts_made(tmp_path) == 3
    assert "crash loop: the same failure 3 attempts in a row" in open(run["log_path"]).read()


HANGING = """
import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
count = os.path.join(sys.argv[1], "count")
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(n))
for step in range(1, 4):
    print("[{}s] step={} loss=1.0 acc=0.1".format(step, step), flush=True)
    time.sleep(0.2)
def stuck_in_a_collective():
    time.sleep(3600)
if n == 1:
    stuck_in_a_collective()
print("attempt", n, "args", sys.argv[2:], "done", flush=True)
"""


def test_a_silent_workload_is_judged_hung_its_stacks_dumped_then_restarted(container, runs_dir, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    status, out = launch(container, runs_dir, "hang", [sys.executable, str(script), str(tmp_path)],
                         "--restart", "on-failure:2", "--restart-backoff", "0.1", "--hang-timeout", "3",
                         "--grace", "2")
    assert status == 0, out
    run = wait_state(container, runs_dir, "hang", TERMINAL, timeout=30)
    assert (run["state"], len(run["attempts"])) == ("succeeded", 2), run
    first = run["attempts"][0]
    assert (first["reason"], first["last_step"], first["signal"]) == ("hung", 3, signal.SIGTERM)
    log = open(run["log_path"]).read()
    hung_at = log.index("judged hung")
    # the stacks are in the log before the attempt was ended, and they show where it was stuck
    stacks = log[hung_at:log.index("restarting in")]
    assert "most recent call first" in stacks and "stuck_in_a_collective" in stacks
    assert "attempt 2 args [] done" in log


def test_a_hung_run_without_a_policy_ends_failed_as_hung(container, runs_dir, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    assert launch(container, runs_dir, "hung", [sys.executable, str(script), str(tmp_path)], "--hang-timeout", "2.5",
                  "--grace", "1")[0] == 0
    run = wait_state(container, runs_dir, "hung", TERMINAL, timeout=20)
    assert (run["state"], run["reason"], run["signal"]) == ("failed", "hung", signal.SIGTERM)


def test_kill_during_the_backoff_ends_the_run_killed_and_nothing_restarts(container, runs_dir, tmp_path):
    assert launch(container, runs_dir, "backoff", flaky(tmp_path, failures=9), "--restart", "on-failure:3",
                  "--restart-backoff", "30")[0] == 0
    waiting = wait_for(lambda: (lambda r: r if r.get("restart_at") else None)(record(container, runs_dir, "backoff")),
                       10, interval=0.1)
    assert waiting and waiting["state"] == "running" and waiting["pid"] is None
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "backoff", "--grace", "2")
    assert status == 0, out
    assert out["runs"][0]["state"] == "killed" and out["runs"][0]["ok"]
    run = record(container, runs_dir, "backoff")
    assert (run["state"], len(run["attempts"]), run["restart_at"]) == ("killed", 1, None)
    assert attempts_made(tmp_path) == 1
    state = json.loads(open(os.path.join(runs_dir, "backoff", "state.json")).read())
    assert state["attempts"][0]["exit_code"] == 3


def test_bad_restart_values_are_refused_before_anything_is_created(container, runs_dir):
    for value, words in (("on-failure:-1", "bad restart count"), ("on-failure:x", "bad restart count"),
                         ("sometimes", "unknown restart policy"), ("never:2", "unknown restart policy")):
        status, out = launch(container, runs_dir, "bad", ["true"], "--restart", value)
        assert (status, out["ok"], out["code"]) == (2, False, "bad_usage"), out
        assert out["error"].startswith("--restart: ") and words in out["error"], out
    assert not os.path.exists(os.path.join(runs_dir, "bad"))


def test_a_lost_run_is_relaunched_once_per_loss_and_resumes(agent_pyz, container, runs_dir, tmp_path):
    """The container reboots (every process of its PID namespace killed at once): the run with a restart policy
    is relaunched as a new run of its command, resuming; a second relaunch of the same loss starts nothing; a
    run without a policy stays lost."""
    command = ["sh", "-c", 'echo "args: $*"; sleep 60', "sh"]
    rebooted = Namespace(agent_pyz, reaps=True)
    try:
        assert launch(rebooted, runs_dir, "lost1", command, "--restart", "on-failure:2",
                      "--retry-arg=--resume", "--retry-arg=auto")[0] == 0
        assert launch(rebooted, runs_dir, "plain", command)[0] == 0
    finally:
        rebooted.stop()
    # the bundled trainer links its metrics.jsonl into the run directory; beside it, its checkpoints
    output = tmp_path / "out"
    for step in ("step_3", "step_12", "step_20.tmp"):
        (output / step).mkdir(parents=True)
    (output / "step_3" / "manifest.json").write_text("{}")
    (output / "step_12" / "manifest.json").write_text("{}")
    (output / "metrics.jsonl").write_text("")
    os.symlink(str(output / "metrics.jsonl"), os.path.join(runs_dir, "lost1", "metrics.jsonl"))
    relaunch = ("relaunch", "--runs-dir", runs_dir, "--run-id", "lost1", "--new-run-id", "lost1-r1", "--settle", "0.3")
    status, out = container.agent(*relaunch)
    assert status == 0, out
    assert (out["resume_args"], out["resumes_from"], out["survivors_ended"]) == (["--resume", "auto"], "step_12", [])
    new = out["run"]
    assert (new["state"], new["relaunch_of"], new["restart_policy"], new["max_attempts"]) == (
        "running", "lost1", "on-failure:1", 2)
    assert wait_for(lambda: "args: --resume auto" in open(new["log_path"]).read(), 5)
    old = record(container, runs_dir, "lost1")
    assert (old["state"], old["relaunched_as"], old["attempts"][0]["reason"]) == ("lost", "lost1-r1", "lost")
    status, again = container.agent(*relaunch[:-4], "--new-run-id", "lost1-r2")
    assert (status, again["code"]) == (1, "already_relaunched") and "already relaunched as lost1-r1" in again["error"]
    status, plain = container.agent("relaunch", "--runs-dir", runs_dir, "--run-id", "plain", "--new-run-id", "p2")
    assert (status, plain["code"]) == (1, "not_relaunched") and "no restart policy" in plain["error"]
    assert record(container, runs_dir, "plain")["state"] == "lost"
    assert not os.path.exists(os.path.join(runs_dir, "lost1-r2")) and not os.path.exists(os.path.join(runs_dir, "p2"))
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "lost1-r1", "--grace", "1")[0] == 0




def test_a_lost_runs_workload_that_outlived_its_supervisor_is_ended_before_the_relaunch(container, runs_dir,
                                                                                       tmp_path):
    """Only the supervisor is SIGKILLed (an OOM kill, a stray kill -9): the run is `lost` while its workload
    runs on under the keeper. The relaunch ends it (TERM first) before the new run starts, and says so."""
    script, lock = tmp_path / "hold.py", str(tmp_path / "lock")
    script.write_text(LOCK_HOLDER)
    status, out = launch(container, runs_dir, "alive", [sys.executable, str(script), lock], "--restart",
                         "on-failure:2", "--grace", "5")
    assert status == 0, out
    old = out["run"]
    assert container.run(["kill", "-KILL", str(old["supervisor_pid"])]).returncode == 0
    lost = wait_state(container, runs_dir, "alive", ("lost",))
    assert os.path.isdir(lock) and lost["relaunched_as"] is None  # its workload still runs
    status, out = container.agent("relaunch", "--runs-dir", runs_dir, "--run-id", "alive", "--new-run-id",
                                  "alive-r1", "--settle", "0.3")
    assert status == 0, out
    log = out["run"]["log_path"]
    assert wait_for(lambda: "holding" in open(log).read() or os.path.exists(lock + ".double"), 10)
    assert not os.path.exists(lock + ".double"), open(log).read()  # one copy at a time
    assert out["survivors_ended"] == [old["pid"]] and out["run"]["state"] == "running"
    again = record(container, runs_dir, "alive")
    assert (again["state"], again["relaunched_as"]) == ("lost", "alive-r1")
    assert "process(es) {} of it still ran and were ended before its relaunch".format(old["pid"]) in again["error"]
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "alive-r1", "--grace", "1")[0] == 0


def test_a_jobs_node_is_relaunched_only_with_its_job_and_only_after_a_loss_or_failure(agent_pyz, container,
                                                                                        runs_dir):
    """A node of a job never restarts alone (no --job-id: refused); with its job it is relaunched as the same
    node of the new job, once; a killed node, or one of a job without a restart policy, never."""
    command = ["sh", "-c", 'echo "args: $*"; sleep 60', "sh"]
    node = ("--job-id", "job1", "--node-rank", "1", "--nnodes", "2")
    rebooted = Namespace(agent_pyz, reaps=True)
    try:
        assert launch(rebooted, runs_dir, "job1-n1", command, *node, "--worker-restarts", "1",
                      "--retry-arg=--resume", "--retry-arg=auto")[0] == 0
        assert launch(rebooted, runs_dir, "job2-n1", command, "--job-id", "job2", "--node-rank", "1",
                      "--nnodes", "2")[0] == 0
    finally:
        rebooted.stop()
    assert launch(container, runs_dir, "job3-n1", command, "--job-id", "job3", "--node-rank", "1", "--nnodes", "2",
                  "--worker-restarts", "1")[0] == 0
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "job3-n1", "--grace", "1")[0] == 0

    def relaunch(run_id: str, new_id: str, *job: str) -> tuple:
        return container.agent("relaunch", "--runs-dir", runs_dir, "--run-id", run_id, "--new-run-id", new_id,
                               "--settle", "0.3", *job)

    status, alone = relaunch("job1-n1", "alone")
    assert (status, alone["code"]) == (1, "not_relaunched") and "restarts with its job, not alone" in alone["error"]
    status, out = relaunch("job1-n1", "job9-n1", "--job-id", "job9")
    assert status == 0, out
    new = out["run"]
    assert (new["job_id"], new["node_rank"], new["nnodes"], new["relaunch_of"], new["restart_policy"],
            new["worker_restarts"], new["job_relaunches"]) == ("job9", 1, 2, "job1-n1", "never", 1, 1)
    assert wait_for(lambda: "args: --resume auto" in open(new["log_path"]).read(), 5)
    assert record(container, runs_dir, "job1-n1")["relaunched_as"] == "job9-n1"
    status, again = relaunch("job1-n1", "job10-n1", "--job-id", "job10")
    assert (status, again["code"]) == (1, "already_relaunched") and "already relaunched as job9-n1" in again["error"]
    status, plain = relaunch("job2-n1", "job11-n1", "--job-id", "job11")
    assert (status, plain["code"]) == (1, "not_relaunched") and "job job2 has no restart policy" in plain["error"]
    status, killed = relaunch("job3-n1", "job12-n1", "--job-id", "job12")
    assert (status, killed["code"]) == (1, "not_relaunched") and "is killed" in killed["error"], killed
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "job9-n1", "--grace", "1")[0] == 0


def test_a_job_is_relaunched_after_a_failure_only_with_relaunches_left_and_never_out_of_a_crash_loop():
    from dflash_agent.relaunch import refusal

    node = {"job_id": "job1", "node_rank": 0, "nnodes": 2, "worker_restarts": 2}
    assert refusal(node, {"state": "failed"}, "job2") is None
    assert refusal(node, {"state": "lost"}, "job2") is None
    assert refusal({**node, "job_relaunches": 1}, {"state": "failed"}, "job3") is None
    assert "relaunches are used up (2 of 2)" in refusal({**node, "job_relaunches": 2}, {"state": "lost"}, "job4")
    looped = refusal(node, {"state": "failed", "reason": "crash loop", "error": "RuntimeError: boom"}, "job2")
    assert "ended in a crash loop: RuntimeError: boom" in looped
    assert "is succeeded" in refusal(node, {"state": "succeeded"}, "job2")


def torchrun_like(tmp_path, *, restarts: int, worker: str) -> list:
    """What torchrun does on one node with --max-restarts: the worker again and again while it fails, each start
    numbered in its environment (TORCHELASTIC_RESTART_COUNT), then exit 1."""
    (tmp_path / "worker.sh").write_text(worker)
    (tmp_path / "torchrun.py").write_text(textwrap.dedent("""\
        import os, subprocess, sys
        for n in range({restarts} + 1):
            env = dict(os.environ, TORCHELASTIC_RESTART_COUNT=str(n))
            if subprocess.call(["sh", "{worker}", str(n)], env=env) == 0:
                sys.exit(0)
        sys.exit(1)
        """).format(restarts=restarts, worker=tmp_path / "worker.sh"))
    return [sys.executable, str(tmp_path / "torchrun.py")]


def job_node(*extra: str) -> tuple:
    return ("--job-id", "job1", "--node-rank", "0", "--nnodes", "1", *extra)


def test_a_job_nodes_worker_restarts_are_its_attempts_and_a_repeated_failure_is_a_crash_loop(container, runs_dir,
                                                                                            tmp_path):
    """torchrun restarting the job's workers: each restart is an attempt of the node's run (ps: attempt k/N);
    the same exception three times with no step stops them before torchrun spends its other restarts."""
    command = torchrun_like(tmp_path, restarts=6, worker='sleep 1.5; echo "RuntimeError: NCCL timeout"; exit 1\n')
    status, out = launch(container, runs_dir, "loop", command, *job_node("--worker-restarts", "6"))
    assert status == 0, out
    assert (out["run"]["max_attempts"], out["run"]["restart_policy"]) == (7, "never")
    ended = wait_state(container, runs_dir, "loop", TERMINAL, timeout=30)
    assert (ended["state"], ended["reason"]) == ("failed", "crash loop"), ended
    assert "RuntimeError: NCCL timeout" in ended["error"]
    reasons = [a["reason"] for a in ended["attempts"]]
    assert reasons[:3] == ["workers restarted"] * 3 and len(reasons) == 4 and ended["attempt"] == 4, reasons
    log = open(ended["log_path"]).read()
    assert "torchrun restarted the job's workers: attempt 2/7" in log and "crash loop" in log


def test_a_job_node_whose_restarts_make_progress_spends_them_all(container, runs_dir, tmp_path):
    command = torchrun_like(tmp_path, restarts=2, worker=textwrap.dedent("""\
        sleep 1.2; echo "[1s] step=$((10 * ($1 + 1))) loss=1.0"; echo "RuntimeError: NCCL timeout"; exit 1
        """))
    assert launch(container, runs_dir, "progress", command, *job_node("--worker-restarts", "2"))[0] == 0
    ended = wait_state(container, runs_dir, "progress", TERMINAL, timeout=30)
    assert (ended["state"], ended["attempt"], ended["max_attempts"]) == ("failed", 3, 3), ended
    assert ended.get("reason") != "crash loop" and "crash loop" not in open(ended["log_path"]).read()
    assert [a["last_step"] for a in ended["attempts"]] == [10, 20, 30]
    assert [a["reason"] for a in ended["attempts"]] == ["workers restarted", "workers restarted", "failed"]
