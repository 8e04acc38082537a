"""launch on `local`-transport hosts with real runs: everything after `--` is the command (even a word that names
a host), --each shows a failed run's log tail as a single launch does, and a real SIGINT to a real launch
after its run started says which run goes on and how to stop it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.workloads import run_cli, stop_keeper
from tests.polling import wait_for
from tests.trainer.conftest import REPO_ROOT

HOSTS = ("box", "sleep")  # `sleep` names a host here, and is also the command below


@pytest.fixture
def two_hosts(tmp_path: Path, monkeypatch):
    """Two local hosts, one of them named like a command, each with a workdir of its own; their keepers are
    stopped afterwards. The cache of where runs live is the test's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lines = ["hosts:"]
    for host in HOSTS:
        lines += [f"  {host}:", "    transport: local", f"    workdir: {json.dumps(str(tmp_path / host))}",
                  f"    python: {json.dumps(sys.executable)}"]
    inv = tmp_path / "inventory.yaml"
    inv.write_text("\n".join(lines) + "\n")
    yield str(inv)
    for host in HOSTS:
        stop_keeper(tmp_path / host / ".dflash" / "runs")


def test_every_word_after_the_dashes_is_the_command_even_a_hosts_name(two_hosts, capsys):
    code, report, err = run_cli(two_hosts, "launch", "box", "--each", "--json", "--", "sleep", "300",
                                capsys=capsys)
    try:
        assert code == 0, err
        assert list(report["targets"]) == ["box"]
        assert [(r["target"], r["command"]) for r in report["runs"]] == [("box", ["sleep", "300"])]
    finally:
        run_cli(two_hosts, "kill", *[r["run_id"] for r in report["runs"]], "--grace", "1", capsys=capsys)


def test_each_shows_the_log_tail_of_a_run_that_ended_during_its_launch(two_hosts, capsys):
    code, report, err = run_cli(two_hosts, "launch", *HOSTS, "--each", "--", "sh", "-c",
                                "echo one; echo 'two: why it failed'; exit 3", capsys=capsys)
    assert code == 1, err
    for host in HOSTS:
        assert f"dflashctl: error: {host}: run " in err and "exit code 3" in err
        assert err.count(" on " + host + ":\n  one\n  two: why it failed\n") == 1, err


# A run that is started and then never seen running (it removes its own log), so that the launch is still
# verifying it, seconds after it started, when the SIGINT comes.
UNVERIFIABLE = "rm -f train.log; touch {marker}; exec sleep 300"


@pytest.mark.parametrize("each", [False, True])
def test_ctrl_c_after_the_run_started_names_it_and_how_to_stop_it(two_hosts, tmp_path, capsys, each):
    marker = tmp_path / "started"
    argv = [sys.executable, "-m", "orchestrator", "--inventory", two_hosts, "launch", "box", "--name", "inter",
            *(["--each"] if each else []), "--", "sh", "-c", UNVERIFIABLE.format(marker=marker)]
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        wait_for(marker.exists, 60, what="the run's workload to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    runs = sorted(p.name for p in (tmp_path / "box" / ".dflash" / "runs").iterdir() if p.name.startswith("inter"))
    assert proc.returncode == 130 and len(runs) == 1, (proc.returncode, runs, err)
    assert (f"dflashctl: interrupted: {runs[0]} was started on box and goes on running without dflashctl; "
            f"`dflashctl kill {runs[0]}` stops it") in err, err
    assert "Traceback" not in err and out == ""
    # it was left running, and the kill it names stops it
    code, killed, err = run_cli(two_hosts, "kill", runs[0], "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and killed["targets"]["box"]["runs"][0]["run"]["state"] == "killed", (killed, err)
