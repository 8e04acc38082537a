"""The supervisor and its hang watchdog never end or misreport a healthy run: whatever the workload prints, however
much at once, and whenever a kill comes. Real supervisors, workloads and signals; where a moment cannot be hit from
outside (a kill between the backoff and the start, a watcher's own bug), the real supervisor process runs with that
moment made to happen (`supervisor_with`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from dflash_agent.launch import LaunchRequest, create_run
from dflash_records.restart import parse_policy
from tests.dflash_agent.pidns import launch, record, wait_for, wait_state

REPO = Path(__file__).resolve().parents[3]
TERMINAL = ("succeeded", "failed", "killed", "lost")


def supervisor_with(patch: str, runs_dir: str, run_id: str, command: list, *, restart: str = "never",
                    backoff: float = 0.1) -> subprocess.Popen:
    """A new run's supervisor started as the keeper starts it (`supervise`, its own session, its log), with the
    Python `patch` run first."""
    create_run(LaunchRequest(runs_dir=runs_dir, run_id=run_id, name="t", target="lab/100", command=command,
                             cwd=None, env_pairs=[], gpus=None, force=True, grace=1.0,
                             restart={"restart": parse_policy(restart), "restart_backoff_s": backoff}))
    code = "import sys\n{}\nfrom dflash_agent.cli import main\nsys.exit(main(sys.argv[1:]))".format(patch)
    with open(os.path.join(runs_dir, run_id, "supervisor.log"), "ab") as log:
        return subprocess.Popen([sys.executable, "-c", code, "supervise", "--runs-dir", runs_dir, "--run-id", run_id],
                                env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, start_new_session=True)


def state_of(runs_dir: str, run_id: str) -> dict:
    with open(os.path.join(runs_dir, run_id, "state.json")) as handle:
        return json.load(handle)


def log_of(run: dict) -> str:
    with open(run["log_path"], errors="replace") as handle:
        return handle.read()


def test_a_step_number_of_5000_digits_neither_crashes_the_supervisor_nor_ends_the_run(container, runs_dir):
    command = ["sh", "-c", 'printf "%s\\n" "$1"; sleep 1; echo "[4s] step=2 loss=1.0"', "sh", "[3s] step=" + "7" * 5000]
    status, out = launch(container, runs_dir, "digits", command, "--hang-timeout", "30", "--restart", "on-failure:2")
    assert status == 0, out
    run = wait_state(container, runs_dir, "digits", TERMINAL, timeout=20)
    assert (run["state"], run["exit_code"], len(run["attempts"])) == ("succeeded", 0, 1), run
    assert run["attempts"][0]["last_step"] == 2 and not run["error"]


def test_an_error_of_its_own_watchers_is_logged_and_the_run_goes_on(runs_dir):
    patch = textwrap.dedent("""\
        from dflash_agent import hangwatch
        def poll(self, now):
            raise RuntimeError("a bug of the watchdog")
        hangwatch.AttemptLog.poll = poll
        """)
    command = ["sh", "-c", 'echo "[1s] step=1 loss=1.0"; sleep 1.5; echo done']
    supervisor = supervisor_with(patch, runs_dir, "buggy", command)
    assert supervisor.wait(timeout=30) == 0
    run = state_of(runs_dir, "buggy")
    assert (run["state"], run["exit_code"], run.get("error")) == ("succeeded", 0, None), run
    log = open(os.path.join(runs_dir, "buggy", "train.log")).read()
    assert "dflash: the supervisor's watchers failed (RuntimeError: a bug of the watchdog)" in log
    assert log.count("watchers failed") == 1 and log.endswith("done\n")  # said once; the workload ran to its end
    assert "Traceback" in open(os.path.join(runs_dir, "buggy", "supervisor.log")).read()


BURST = """
import sys, time
def step(n):
    print("[{}s] step={} loss=1.0".format(n, n), flush=True)
for n in range(1, 4):
    step(n)
    time.sleep(0.3)
line = b"a burst of output that holds no step line " + b"." * 56 + b"\\n"
sys.stdout.buffer.write(line * (32 * 1024 * 1024 // len(line)))
sys.stdout.flush()
for n in range(4, 16):
    step(n)
    time.sleep(0.3)
"""


def test_a_burst_of_output_does_not_make_a_stepping_run_hung(container, runs_dir, tmp_path):
    """32 MB at once, then a step every 0.3 s: a watchdog that read 1 MiB a look was still in the burst when its
    2 s bound ran out."""
    (tmp_path / "burst.py").write_text(BURST)
    status, out = launch(container, runs_dir, "burst", [sys.executable, str(tmp_path / "burst.py")],
                         "--hang-timeout", "2", "--grace", "1")
    assert status == 0, out
    run = wait_state(container, runs_dir, "burst", TERMINAL, timeout=60)
    assert (run["state"], run.get("reason"), run["attempts"][0]["last_step"]) == ("succeeded", None, 15), run
    assert "judged hung" not in log_of(run)[-4096:]


HANGS_THEN_EXITS_0 = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
for n in (1, 2, 3):
    print("[{}s] step={} loss=1.0".format(n, n), flush=True)
    time.sleep(0.2)
time.sleep(600)
"""


def test_a_hung_run_that_exits_0_on_sigterm_is_failed_hung(container, runs_dir, tmp_path):
    (tmp_path / "hang.py").write_text(HANGS_THEN_EXITS_0)
    assert launch(container, runs_dir, "hung0", [sys.executable, str(tmp_path / "hang.py")], "--hang-timeout", "1.5",
                  "--grace", "5")[0] == 0
    run = wait_state(container, runs_dir, "hung0", TERMINAL, timeout=30)
    assert (run["state"], run["reason"], run["exit_code"]) == ("failed", "hung", 0), run
    assert run["attempts"][0]["reason"] == "hung"


def test_a_killed_workload_that_exits_0_on_sigterm_gets_one_sigterm_and_keeps_its_exit_code(runs_dir, tmp_path):
    """The supervisor signalled the workload's group and then each of the run's processes, the workload among
    them: a second SIGTERM landed while it was exiting on the first and killed it, so a run that exits 0 on
    SIGTERM was recorded with no exit code (as CI once saw for a hung one)."""
    (tmp_path / "hang.py").write_text(HANGS_THEN_EXITS_0)
    supervisor = supervisor_with("", runs_dir, "twice", [sys.executable, str(tmp_path / "hang.py")])
    log = Path(runs_dir, "twice", "train.log")
    assert wait_for(lambda: log.exists() and "step=3" in log.read_text(errors="replace"), 30)
    os.kill(supervisor.pid, signal.SIGTERM)
    supervisor.wait(timeout=30)
    run = state_of(runs_dir, "twice")
    assert (run["state"], run["exit_code"], run["attempts"][0]["signal"]) == ("killed", 0, None), run


def test_a_restart_backoff_out_of_range_is_refused(container, runs_dir):
    for value in ("1e308", "301", "-1", "nan", "inf"):
        status, out = launch(container, runs_dir, "far", ["true"], "--restart", "on-failure", "--restart-backoff", value)
        assert (status, out["code"]) == (2, "bad_usage") and "--restart-backoff" in out["error"], out
    assert not os.path.exists(os.path.join(runs_dir, "far"))


def test_a_kill_right_after_the_backoff_starts_no_workload(runs_dir, tmp_path):
    """The kill lands after the backoff's last look for one and before the start: nothing starts."""
    patch = textwrap.dedent("""\
        import os, signal
        from dflash_agent import supervisor
        waited = supervisor.Supervisor.back_off
        def back_off(self, wakeup):
            done = waited(self, wakeup)
            os.kill(os.getpid(), signal.SIGTERM)
            return done
        supervisor.Supervisor.back_off = back_off
        """)
    count = tmp_path / "count"
    command = ["sh", "-c", 'echo x >> "$1"; sleep 1; exit 3', "sh", str(count)]
    supervisor = supervisor_with(patch, runs_dir, "late", command, restart="on-failure:3")
    supervisor.wait(timeout=30)
    run = state_of(runs_dir, "late")
    assert (run["state"], len(run["attempts"]), run["reason"], run["signal"]) == (
        "killed", 1, "killed during the backoff", None), run
    assert count.read_text() == "x\n"  # one attempt ever started


def test_with_a_policy_a_command_that_dies_before_it_settles_fails_the_launch(container, runs_dir):
    status, out = launch(container, runs_dir, "typo", ["sh", "-c", "exit 3"], "--restart", "on-failure:3",
                         "--restart-backoff", "0.1", settle="1")
    assert (status, out["code"]) == (1, "run_ended"), out
    run = wait_state(container, runs_dir, "typo", TERMINAL)
    assert (run["state"], run["exit_code"], len(run["attempts"]), run["restart_at"]) == ("failed", 3, 1, None), run
    assert "not restarted" in log_of(run)


def in_backoff(container, runs_dir: str, run_id: str) -> dict:
    """A run launched to fail after its settle time, once its supervisor waits 30 s before the next attempt."""
    assert launch(container, runs_dir, run_id, ["sh", "-c", "sleep 0.5; exit 3"], "--restart", "on-failure:3",
                  "--restart-backoff", "30")[0] == 0
    waiting = wait_for(lambda: (lambda r: r if r.get("restart_at") else None)(record(container, runs_dir, run_id)),
                       10, interval=0.1)
    assert waiting and waiting["state"] == "running", record(container, runs_dir, run_id)
    return waiting


def test_a_kill_during_the_backoff_is_recorded_as_such(container, runs_dir):
    in_backoff(container, runs_dir, "killed")
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "killed", "--grace", "2")[0] == 0
    killed = record(container, runs_dir, "killed")
    assert (killed["state"], killed["reason"], killed["signal"], killed["exit_code"]) == (
        "killed", "killed during the backoff", None, None), killed
    assert log_of(killed).endswith("dflash: killed during the backoff (attempt 2/4 was next)\n")


def test_a_supervisor_lost_in_a_backoff_leaves_no_restart_time(container, runs_dir):
    waiting = in_backoff(container, runs_dir, "lost")
    container.run(["kill", "-KILL", str(waiting["supervisor_pid"])])
    lost = wait_state(container, runs_dir, "lost", ("lost",))
    assert lost["restart_at"] is None, lost
