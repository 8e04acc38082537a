"""Runs that heal themselves on the lab, over SSH and pct: a run restarted by its supervisor after failures, and a
run lost with its rebooted container relaunched once by `watch --headless`, resuming."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.errors import OperationFailed
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RelaunchFailed, RunClient
from orchestrator.transports.pool import Connections
from tests.lab.workloads import LOCK_HOLDER, fresh_workdir, run_cli
from tests.polling import wait_for

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
TARGET = "pve2/300"
# a command the launch takes for the bundled trainer's `train` (it carries `-m trainer train`), so a restarted or
# relaunched attempt gets `--resume auto` appended, which it prints; it then waits to be killed
RESUMABLE = ["python3", "-c", "import sys, time; print('args:', sys.argv[1:], flush=True); time.sleep(600)",
             "-m", "trainer", "train"]


def headless_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")] if path.exists() else []


@contextmanager
def headless_watch(inv: str, out: Path):
    """`watch TARGET --headless` on its own, its JSON lines into `out`; stopped with SIGTERM, it exits 0."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with out.open("w") as stdout:
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inv, "watch", TARGET, "--headless",
                                    "--no-notify"], stdout=stdout, stderr=subprocess.PIPE, env=env, text=True)
        try:
            yield watcher
        finally:
            watcher.send_signal(signal.SIGTERM)
            _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0 and "Traceback" not in err, err


def lines_of(out: Path, line_type: str, timeout: float) -> list[dict]:
    return wait_for(lambda: [line for line in headless_lines(out) if line["type"] == line_type], timeout,
                    interval=0.3, what=lambda: out.read_text())


def kill_supervisor(lab, record: dict, *also: int) -> None:
    """SIGKILL the run's supervisor alone (an OOM kill, a stray kill -9), and the pids in `also`."""
    pids = [str(pid) for pid in (record["supervisor_pid"], *also)]
    assert lab.ct_run("pve2", 300, ["kill", "-KILL", *pids]).returncode == 0


def test_a_lost_run_with_a_restart_policy_is_relaunched_once_by_a_headless_watch(lab, tmp_path, capsys):
    workdir = fresh_workdir(lab, tmp_path / "inventory.yaml", "heal")
    inv = str(tmp_path / "inventory.yaml")
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:2", "--name", "healing",
                                "--", *RESUMABLE, capsys=capsys)
    assert code == 0, err
    code, plain, err = run_cli(inv, "launch", TARGET, "--json", "--name", "plain", "--", "sleep", "600",
                               capsys=capsys)
    assert code == 0, err
    lab.pct("pve2", "reboot", "300", check=True)
    out = tmp_path / "headless.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with out.open("w") as stdout:
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inv, "watch", TARGET, "--headless",
                                    "--no-notify"], stdout=stdout, stderr=subprocess.PIPE, env=env, text=True)
        try:
            said = wait_for(lambda: [line for line in headless_lines(out) if line["type"] == "relaunched"], 60,
                            interval=0.3, what=lambda: out.read_text())
            wait_for(lambda: [line for line in headless_lines(out) if line.get("kind") == "restarted"], 10,
                     interval=0.2)
        finally:
            watcher.send_signal(signal.SIGTERM)
            _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0 and "Traceback" not in err, err
    [line] = said
    # the trainer's command gets `--resume auto`, but this one wrote no checkpoint: nothing is said to be resumed
    assert line["run_id"] == record["run_id"] and "starting over: no checkpoint to resume from yet" in line["message"]
    assert "resuming" not in line["message"]
    new_id = line["new_run_id"]
    # once per loss: the watcher tried no run twice, and the run without a policy stays lost
    assert [x["run_id"] for x in headless_lines(out) if x["type"].startswith("relaunch")] == [record["run_id"]]
    code, listing, _ = run_cli(inv, "ps", "--all", "--json", capsys=capsys)
    runs = {r["run_id"]: r for r in listing["runs"]}
    assert runs[record["run_id"]]["state"] == "lost" and runs[record["run_id"]]["relaunched_as"] == new_id
    assert runs[plain["run_id"]]["state"] == "lost" and not runs[plain["run_id"]]["relaunched_as"]
    assert (runs[new_id]["state"], runs[new_id]["relaunch_of"]) == ("running", record["run_id"])
    log = workdir / ".dflash" / "runs" / new_id / "train.log"
    assert wait_for(lambda: "'train', '--resume', 'auto']" in log.read_text(), 10), log.read_text()
    # a second relaunch of the same loss (another watcher) starts nothing
    with Connections() as conns:
        client = RunClient(load_inventory(Path(inv)), conns)
        with pytest.raises(OperationFailed, match="already relaunched as " + new_id) as refused:
            client.relaunch(client.inventory.target(TARGET), record["run_id"], name="healing")
        assert isinstance(refused.value, RelaunchFailed) and refused.value.code == "already_relaunched"
        client.kill(client.inventory.target(TARGET), [new_id], grace=1)


def test_a_failing_run_restarts_inside_the_container_until_it_succeeds(lab, tmp_path, capsys):
    workdir = fresh_workdir(lab, tmp_path / "inventory.yaml", "restart")
    inv = str(tmp_path / "inventory.yaml")
    script = ("import os, sys, time; p = 'count'; n = int(open(p).read()) + 1 if os.path.exists(p) else 1; "
              "open(p, 'w').write(str(n)); print('[%ds] step=%d loss=1.0' % (n, n), flush=True); time.sleep(1.2); "
              "sys.exit(0 if n >= 3 else 'RuntimeError: attempt %d' % n)")
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:3", "--restart-backoff",
                                "0.2", "--", "python3", "-c", script, capsys=capsys)
    assert code == 0, err
    state_path = workdir / ".dflash" / "runs" / record["run_id"] / "state.json"
    assert wait_for(lambda: json.loads(state_path.read_text())["state"] == "succeeded", 30, interval=0.2), \
        state_path.read_text()
    state = json.loads(state_path.read_text())
    assert [(a["exit_code"], a["exception"], a["last_step"]) for a in state["attempts"]] == [
        (1, "RuntimeError: attempt 1", 1), (1, "RuntimeError: attempt 2", 2), (0, None, 3)]



def test_a_crafted_step_line_and_a_burst_of_output_leave_a_healthy_run_alone(lab, tmp_path, capsys):
    """A step number of 5,000 digits (once a ValueError that crashed the supervisor and failed the run) and an
    8 MB burst of output (once a backlog the watchdog judged as silence) under a watchdog of 2 s and a restart
    policy: the run steps on and succeeds on its first attempt."""
    workdir = fresh_workdir(lab, tmp_path / "inventory.yaml", "crafted")
    inv = str(tmp_path / "inventory.yaml")
    script = ("import sys, time; print('[3s] step=' + '9' * 5000, flush=True); sys.stdout.write('x' * 8000000 + "
              "'\\n'); sys.stdout.flush()\nfor i in range(1, 12):\n    print('[%ds] step=%d loss=1.0' % (i, i), "
              "flush=True); time.sleep(0.3)")
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:2", "--hang-timeout", "2",
                                "--", "python3", "-c", script, capsys=capsys)
    assert code == 0, err
    state_path = workdir / ".dflash" / "runs" / record["run_id"] / "state.json"
    assert wait_for(lambda: json.loads(state_path.read_text())["state"] in ("succeeded", "failed", "lost"), 60,
                    interval=0.3), state_path.read_text()
    state = json.loads(state_path.read_text())
    assert (state["state"], len(state["attempts"]), state.get("reason")) == ("succeeded", 1, None), state
    code, listed, err = run_cli(inv, "ps", TARGET, "--all", "--json", capsys=capsys)
    assert code == 0 and [r["state"] for r in listed["runs"] if r["run_id"] == record["run_id"]] == ["succeeded"]


# attempt 1 fails with a traceback; attempt 2 steps, then hangs in silence and leaves with 0 on SIGTERM
FAILS_THEN_HANGS = """
import os, signal, sys, time
n = int(open('count').read()) + 1 if os.path.exists('count') else 1
open('count', 'w').write(str(n))
for i in range(1, 4):
    print('[%ds] step=%d loss=1.0' % (i, i), flush=True)
    time.sleep(0.6)  # past the launch's settle time (1 s): an attempt that dies before it is a failed launch
if n == 1:
    raise RuntimeError('boom')
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(600)
"""


def test_a_hung_attempt_after_a_failed_one_is_failed_hung_in_every_view(lab, tmp_path, capsys):
    """The watchdog ends the second attempt, whose workload exits 0 on SIGTERM: the run is failed (reason hung),
    never succeeded; ps says `failed (hung, ...)`; the dashboard's data count the first attempt's exception once
    and never take the supervisor's own `dflash: attempt 1/2 failed ... restarting` line for one."""
    workdir = fresh_workdir(lab, tmp_path / "inventory.yaml", "hung")
    inv = str(tmp_path / "inventory.yaml")
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:1", "--restart-backoff",
                                "0.2", "--hang-timeout", "2", "--grace", "1", "--", "python3", "-c",
                                FAILS_THEN_HANGS, capsys=capsys)
    assert code == 0, err
    state_path = workdir / ".dflash" / "runs" / record["run_id"] / "state.json"
    assert wait_for(lambda: json.loads(state_path.read_text())["state"] not in ("starting", "running"), 90,
                    interval=0.3), state_path.read_text()
    state = json.loads(state_path.read_text())
    assert (state["state"], state["reason"], len(state["attempts"])) == ("failed", "hung", 2), state
    code, table, err = run_cli(inv, "ps", TARGET, "--all", capsys=capsys)
    assert code == 0 and any(record["run_id"] in line and "failed (hung" in line for line in table.splitlines()), \
        table
    code, snapshot, err = run_cli(inv, "watch", TARGET, "--once", "--json", "--all", capsys=capsys)
    run = next(r for r in snapshot["runs"] if r["run_id"] == record["run_id"])
    assert run["exceptions"] == 1, run
    assert run["exception_texts"][-1].splitlines()[-1] == "RuntimeError: boom", run["exception_texts"]
    assert not any("dflash: attempt" in text for text in run["exception_texts"]), run["exception_texts"]



def test_a_lost_runs_workload_that_outlived_its_supervisor_is_ended_before_the_relaunch(lab, tmp_path, capsys):
    """SIGKILL the supervisor alone: the run is `lost` while its workload runs on under the keeper, in the same
    output directory. The headless watch relaunches it only once that workload has ended (TERM first), and says
    so; a plain command is not said to resume from a checkpoint."""
    workdir = fresh_workdir(lab, tmp_path / "inventory.yaml", "survivor")
    inv, lock = str(tmp_path / "inventory.yaml"), f"/workspace/{workdir.name}/lock"
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:2", "--grace", "5",
                                "--name", "survivor", "--", "python3", "-c", LOCK_HOLDER, lock, capsys=capsys)
    assert code == 0, err
    kill_supervisor(lab, record)
    with headless_watch(inv, tmp_path / "headless.jsonl"):
        [line] = lines_of(tmp_path / "headless.jsonl", "relaunched", 60)
    new_log = workdir / ".dflash" / "runs" / line["new_run_id"] / "train.log"
    assert wait_for(lambda: "holding" in new_log.read_text() or (workdir / "lock.double").exists(), 15)
    assert not (workdir / "lock.double").exists(), new_log.read_text()  # never two copies at once
    assert line["run_id"] == record["run_id"], line
    assert f"process(es) {record['pid']} of it still ran: ended first" in line["message"], line
    assert "running its command again as it was" in line["message"] and "resum" not in line["message"], line
    code, _, err = run_cli(inv, "kill", line["new_run_id"], "--grace", "1", capsys=capsys)
    assert code == 0, err


def test_a_relaunch_that_failed_is_tried_again_while_the_loss_is_unclaimed(lab, tmp_path, capsys):
    """The first relaunch's `pct exec` fails (an attach that failed, once): the watch says so, tries again a
    few seconds later, and that try relaunches the run."""
    fresh_workdir(lab, tmp_path / "inventory.yaml", "retry")
    inv = str(tmp_path / "inventory.yaml")
    code, record, err = run_cli(inv, "launch", TARGET, "--json", "--restart", "on-failure:2", "--name", "retry",
                                "--", "sleep", "600", capsys=capsys)
    assert code == 0, err
    kill_supervisor(lab, record, record["pid"])
    knob = lab.hosts["pve2"].containers[300].dir / "exec-fails"
    knob.write_text("relaunch\n")
    out = tmp_path / "headless.jsonl"
    try:
        with headless_watch(inv, out):
            [done] = lines_of(out, "relaunched", 60)
    finally:
        knob.unlink(missing_ok=True)
    failed = [line for line in headless_lines(out) if line["type"] == "relaunch_failed"]
    assert len(failed) == 1 and "trying again in 5s" in failed[0]["message"], failed
    assert done["run_id"] == record["run_id"] and "(try 2)" in done["message"], done
    assert done["time"] >= failed[0]["time"]
    code, listing, _ = run_cli(inv, "ps", "--all", "--json", capsys=capsys)
    runs = {r["run_id"]: r for r in listing["runs"]}
    assert runs[record["run_id"]]["relaunched_as"] == done["new_run_id"]
    assert runs[done["new_run_id"]]["state"] == "running"
    code, _, err = run_cli(inv, "kill", done["new_run_id"], "--grace", "1", capsys=capsys)
    assert code == 0, err
