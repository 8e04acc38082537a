"""Runs that heal themselves on the lab, over SSH and pct: a run restarted by its supervisor after failures, and a
run lost with its rebooted container relaunched once by `watch --headless`, resuming."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import OperationFailed
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RunClient
from orchestrator.transports.pool import Connections
from tests.lab.workloads import fresh_workdir, run_cli
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
    assert line["run_id"] == record["run_id"] and "resuming from its newest checkpoint" in line["message"]
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
        with pytest.raises(OperationFailed, match="already relaunched as " + new_id):
            client.relaunch(client.inventory.target(TARGET), record["run_id"], name="healing")
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
