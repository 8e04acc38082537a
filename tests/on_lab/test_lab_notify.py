"""Notifications on the lab: a `watch --headless` sends a lab run's stall, recovery, exception and failure to an
HTTP sink on 127.0.0.1 (repeats collapsed, nothing for a healthy run), and the same watcher launched detached on
`local` outlives the shell that launched it, shows in `ps`, stops with `kill`, and reports a later run's failure."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_records.step import read_step_line
from orchestrator.display import step_figures
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.pool import Connections
from tests.lab.workloads import STEP, counter, quick_inventory, run_cli, stop_keeper
from tests.notify_sink import NotifySink, Received
from tests.orchestrator.notify.test_notify import burst_beside_a_hung_webhook
from tests.polling import wait_for

pytest.importorskip("apprise")
pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
STALL_S = 4  # --stall: short, so a stall takes seconds; the healthy run's lines come 20 times as often
GAP_S = 7.5  # the troubled run's silences: past the stall limit and the next tick
# Steps, a stall, steps (recovered), a second stall (collapsed: within the repeat window), steps, an exception
# in the log while it carries on, steps, then a second exception that ends the run with exit code 1.
TROUBLED = f"""
import time
STEP = {STEP!r}
i = 0
def steps(n):
    global i
    for _ in range(n):
        i += 1
        print(STEP.format(i=i), flush=True)
        time.sleep(0.2)
steps(8); time.sleep({GAP_S})
steps(8); time.sleep({GAP_S})
steps(4)
print('Traceback (most recent call last):\\n  File "train.py", line 3, in <module>\\n    step()\\n'
      'RuntimeError: first failure', flush=True)
steps(4)
raise RuntimeError("second failure")
"""

VETERAN = ("import time; print('Traceback (most recent call last):\\n  File \"x.py\", line 1, in <module>\\n'"
           "'OSError: old failure', flush=True); time.sleep(3600)")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def figures(step: int) -> str:
    """What a notification says of a run's last step: the figures of its record (from its step line here: the
    workload writes no metrics.jsonl)."""
    return step_figures(read_step_line(STEP.format(i=step)))


def kind_of(message: Received) -> str:
    return message.title.rsplit(": ", 1)[-1]


def headless_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def wait_for_line(path: Path, predicate, timeout: float) -> dict:
    """The first line of the headless watch's output `path` that `predicate` accepts (tests/polling.py's loop)."""
    return wait_for(lambda: next((line for line in headless_lines(path) if predicate(line)), None)
                    if path.exists() else None, timeout, 0.2,
                    what=lambda: f"no such line: {path.read_text() if path.exists() else '(no file)'}")


def test_a_headless_watch_notifies_stall_recovery_and_failure_and_nothing_for_a_healthy_run(lab, tmp_path):
    inventory = quick_inventory(lab, tmp_path / "inventory.yaml")
    target = inventory.target("pve2/300")
    out = tmp_path / "headless.jsonl"
    with NotifySink() as sink, Connections() as conns, out.open("w") as stdout:
        client = RunClient(inventory, conns)
        # a run whose log held a traceback before the watch began: old news, printed but not sent
        veteran = client.launch(LaunchSpec(target, [sys.executable, "-c", VETERAN], "veteran")).run_id
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", str(inventory.path), "watch",
                                    "pve2/300", "--headless", "--stall", str(STALL_S), "--notify", sink.url()],
                                   stdout=stdout, stderr=subprocess.PIPE, env=env(), text=True)
        try:
            wait_for_line(out, lambda line: line["type"] == "host" and line["connected"], 30)
            healthy = client.launch(LaunchSpec(target, [sys.executable, "-c", counter(0.2)], "healthy")).run_id
            troubled = client.launch(LaunchSpec(target, [sys.executable, "-c", TROUBLED], "troubled")).run_id
            sink.wait_for(lambda got: any(kind_of(m) == "failed" for m in got), 180)
            time.sleep(2)  # anything else would come now
            watcher.send_signal(signal.SIGTERM)
            _, err = watcher.communicate(timeout=20)
        finally:
            if watcher.poll() is None:
                watcher.kill()
            client.kill(target, [healthy, veteran], grace=1)
    assert watcher.returncode == 0 and "Traceback" not in err, err
    assert sink.about(healthy) == [] and sink.about(veteran) == []
    [old] = [line for line in headless_lines(out) if line.get("run_id") == veteran]
    assert old["kind"] == "exception" and old["backlog"] is True and "old failure" in old["message"]
    sent = sink.about(troubled)
    assert [(kind_of(m), m.type) for m in sent] == [("stall", "warning"), ("recovered", "success"),
                                                    ("exception", "failure"), ("failed", "failure")]
    for message in sent:
        assert message.title == f"dflashctl: troubled on pve2/300: {kind_of(message)}"
        assert f"run {troubled} (troubled) on pve2/300" in message.message and message.path == "/hook"
    stall, recovered, exception, failed = (m.message.splitlines() for m in sent)
    assert stall[0].startswith("stall: no new step for ") and stall[-1] == f"last step: {figures(8)}"
    assert recovered[0] == "recovered: the run is healthy again" and recovered[-1].startswith("last step: step ")
    assert "RuntimeError: first failure" in exception[0]
    assert failed[0] == "failed: run failed, exit code 1" and failed[-1] == f"last step: {figures(24)}"
    # the alerts themselves are all printed: the second stall and the second exception were only not sent
    printed = [line["kind"] for line in headless_lines(out) if line["type"] == "alert" and line["run_id"] == troubled]
    assert printed.count("stall") == 2 and printed.count("exception") == 2 and "ended" in printed
    assert not [line for line in headless_lines(out) if line.get("run_id") == healthy]


def test_a_detached_headless_watch_survives_its_shell_and_notifies_a_later_failure(lab, tmp_path, capsys):
    work = tmp_path / "work"
    inventory = quick_inventory(lab, tmp_path / "inventory.yaml")
    with NotifySink() as sink:
        text = inventory.path.read_text().replace(str(lab.root / "local-workdir"), str(work))
        inventory.path.write_text(text + f"notify:\n  - url: {sink.url('failures')}\n    kinds: [failed]\n")
        inv = str(inventory.path)
        try:
            watcher = launch_from_a_shell_that_dies(inv, tmp_path)
            code, listed, _ = run_cli(inv, "ps", "local", "--json", capsys=capsys)
            [row] = [r for r in listed["runs"] if r["run_id"] == watcher]
            assert code == 0 and row["state"] == "running" and row["name"] == "notifier"
            assert b"--headless" in Path(f"/proc/{row['pid']}/cmdline").read_bytes()
            log = work / ".dflash" / "runs" / watcher / "train.log"
            wait_for_line(log, lambda line: line["type"] == "host" and line["connected"], 30)
            doomed = f"import time; print({STEP.format(i=1)!r}, flush=True); time.sleep(3); raise SystemExit(3)"
            code, record, err = run_cli(inv, "launch", "pve2/300", "--name", "doomed", "--json", "--",
                                        sys.executable, "-c", doomed, capsys=capsys)
            assert code == 0, err
            [failed] = sink.wait_for(lambda got: any(record["run_id"] in m.message for m in got), 60)
            assert failed.path == "/failures" and failed.title == "dflashctl: doomed on pve2/300: failed"
            assert failed.message.splitlines() == ["failed: run failed, exit code 3",
                                                   f"run {record['run_id']} (doomed) on pve2/300, failed",
                                                   f"last step: {figures(1)}"]
            code, killed, err = run_cli(inv, "kill", "notifier", "--grace", "10", "--json", capsys=capsys)
            assert code == 0, err
            assert killed["targets"]["local"]["runs"][0]["state"] == "killed"
            assert not Path(f"/proc/{row['pid']}").exists()
        finally:
            run_cli(inv, "kill", "notifier", "--grace", "1", capsys=capsys)  # a no-op once it is killed
            stop_keeper(work / ".dflash" / "runs")


def launch_from_a_shell_that_dies(inv: str, tmp_path: Path) -> str:
    """`launch local -- ... watch --headless` from a shell whose whole session then gets SIGHUP and SIGKILL,
    as when the terminal it ran in closes; returns the watcher's run id."""
    said = tmp_path / "launch.out"
    command = (f"{sys.executable} -m orchestrator -i {inv} launch local --name notifier --env PYTHONPATH={REPO} -- "
               f"{sys.executable} -m orchestrator -i {inv} watch pve2/300 --headless > {said} 2>&1; sleep 600")
    shell = subprocess.Popen(["bash", "-c", command], start_new_session=True, env=env())
    deadline = time.monotonic() + 60
    while "is running on local" not in (said.read_text() if said.exists() else ""):
        assert time.monotonic() < deadline and shell.poll() is None, said.read_text() if said.exists() else ""
        time.sleep(0.2)
    os.killpg(shell.pid, signal.SIGHUP)
    time.sleep(0.5)
    if shell.poll() is None:
        os.killpg(shell.pid, signal.SIGKILL)
    shell.wait(10)
    return re.search(r"\bnotifier-\S+", said.read_text()).group(0)


@pytest.mark.lab
def test_a_hung_service_delays_no_other_on_a_lab_container(lab, tmp_path: Path, capsys) -> None:
    """The burst of tests/orchestrator/notify/test_notify.py (six runs on `local`) from six runs in a lab container,
    watched over SSH and pct exec."""
    inv = tmp_path / "inventory.yaml"
    quick_inventory(lab, inv)
    name = f"go-{os.getpid()}-{time.monotonic_ns()}"
    burst_beside_a_hung_webhook(inv, "pve1/200", go=lab.hosts["pve1"].containers[200].workspace / name,
                                go_seen_by_runs=f"/workspace/{name}", capsys=capsys)
