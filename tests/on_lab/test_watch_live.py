"""The live source against the lab: real sshd + pct stand-in + fake nvidia-smi, real supervised runs."""
from __future__ import annotations

import json
import sys
import time

import pytest

from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.pool import Connections
from orchestrator.watch.source import LiveSource
from tests.lab.workloads import QUIET, STEP, counter, log_path, quick_inventory
from tests.lab.workloads import TRACEBACK as TRACEBACK_TEMPLATE
from tests.polling import wait_for

pytestmark = pytest.mark.lab

# Prints numbered step lines for as long as it runs: the stream must deliver each exactly once.
COUNTER = counter(0.1)
TRACEBACK = TRACEBACK_TEMPLATE.format(message="CUDA error: an illegal memory access was encountered")


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory):
    return quick_inventory(lab, tmp_path_factory.mktemp("inv") / "inventory.yaml")


@pytest.fixture(scope="module")
def launched(lab, inventory):
    """A quiet run on pve1/200 and a counting one on pve2/300, killed at the end."""
    with Connections() as conns:
        client = RunClient(inventory, conns)
        quiet = client.launch(LaunchSpec(inventory.target("pve1/200"), [sys.executable, "-c", QUIET], "quiet"))
        counter = client.launch(LaunchSpec(inventory.target("pve2/300"), [sys.executable, "-c", COUNTER], "counter"))
        yield {"quiet": quiet, "counter": counter}
        client.kill(inventory.target("pve1/200"), [quiet.run_id], grace=1)  # a no-op for an ended run
        client.kill(inventory.target("pve2/300"), [counter.run_id], grace=1)


@pytest.fixture()
def source(inventory, launched):
    targets = [inventory.target("pve1/200"), inventory.target("pve2/300")]
    with LiveSource(inventory, targets, heartbeat_s=1.0) as live:
        assert live.wait_until_answered(30)
        yield live


def changes(source: LiveSource) -> dict:
    """How the tests here poll (tests/polling.py): again at each change of the source, naming its hosts on a timeout."""
    return {"interval": 0.2, "pause": source.wait_for_change, "what": lambda: f"hosts {source.snapshot().hosts}"}


def run_of(snapshot, run_id: str):
    return next((r for r in snapshot.runs if r.run_id == run_id), None)


def test_runs_of_two_hosts_update_live(lab, inventory, launched, source: LiveSource) -> None:
    quiet, counter = launched["quiet"].run_id, launched["counter"].run_id
    snapshot = source.snapshot()
    assert {quiet: "pve1/200", counter: "pve2/300"}.items() <= {r.run_id: r.target for r in snapshot.runs}.items()
    assert run_of(snapshot, quiet).phase == "loading_dataset"
    assert len([g for g in snapshot.gpus if g.target == "pve1/200"]) == 8
    log = log_path(lab, inventory, "pve1", 200, quiet)
    started = time.monotonic()
    with log.open("a") as handle:
        handle.write(STEP.format(i=7777) + "\n")
    wait_for(lambda: run_of(source.snapshot(), quiet).last_step == 7777, 3.0, **changes(source))
    assert time.monotonic() - started < 1.5
    with log.open("a") as handle:
        handle.write(TRACEBACK)
    alert = wait_for(lambda: next((a for a in source.snapshot().alerts if a.kind == "exception" and a.run_id == quiet),
                                  None), 5.0, **changes(source))
    assert "illegal memory access" in alert.message and alert.target == "pve1/200"
    assert "RuntimeError" in run_of(source.snapshot(), quiet).exception_texts[-1]
    lab.set_gpus("pve2", 300, [{"memory.used": 4321, "utilization.gpu": 77}])
    try:
        wait_for(lambda: any(g.target == "pve2/300" and g.row.utilization_pct == 77
                             for g in source.snapshot().gpus), 5.0, **changes(source))
    finally:
        lab.set_gpus("pve2", 300, [{}])  # back to the session's idle H200 for the tests after


def test_a_lost_host_is_shown_and_its_log_resumes_without_loss(lab, inventory, launched,
                                                                source: LiveSource) -> None:
    quiet, counter = launched["quiet"].run_id, launched["counter"].run_id
    wait_for(lambda: (run_of(source.snapshot(), counter).last_step or 0) > 5, 5.0, **changes(source))
    lab.link_down("pve2")
    try:
        host = wait_for(lambda: next((h for h in source.snapshot().hosts if h.name == "pve2" and not h.connected),
                                     None), 10.0, **changes(source))
        assert host.error
        stalled_at = run_of(source.snapshot(), counter).last_step
        with log_path(lab, inventory, "pve1", 200, quiet).open("a") as handle:
            handle.write(STEP.format(i=8888) + "\n")
        wait_for(lambda: run_of(source.snapshot(), quiet).last_step == 8888, 3.0,  # pve1 keeps updating
                 **changes(source))
        assert next(h for h in source.snapshot().hosts if h.name == "pve1").connected
        time.sleep(2.0)  # the counter writes ~20 lines meanwhile
    finally:
        lab.link_up("pve2")
    wait_for(lambda: (run_of(source.snapshot(), counter).last_step or 0) > stalled_at + 20, 25.0, **changes(source))
    steps = [point.step for point in run_of(source.snapshot(), counter).history]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "a step line was lost or repeated"


def test_kill_and_log_lines_through_the_source(lab, inventory, launched, source: LiveSource) -> None:
    counter = launched["counter"].run_id
    total = source.log_line_count(counter)
    assert total > 10
    lines = source.log_lines(counter, 0, 3)
    assert [json_step(line) for line in lines] == [1, 2, 3]
    assert json_step(source.log_lines(counter, total - 1, total)[0]) >= total - 1
    result = source.kill(counter, grace=1)
    assert result.ok, result.message
    wait_for(lambda: run_of(source.snapshot(), counter).state == "killed", 5.0, **changes(source))
    ended = [a for a in source.snapshot().alerts if a.kind == "ended" and a.run_id == counter]
    assert ended and ended[-1].severity == "warning"
    plan = source.cleanup("pve2/300", dry_run=True)
    assert plan.ok and plan.cleanup is not None and plan.cleanup.dry_run
    assert ("planned" in plan.message) == bool(plan.cleanup.actions), plan.message  # else "nothing to clean"


def json_step(line: str) -> int:
    return int(line.split("step=")[1].split()[0])


def test_watch_once_json(lab, inventory, launched, monkeypatch, capsys) -> None:
    from orchestrator.cli import main as run_cli

    code = run_cli(["--inventory", str(inventory.path), "watch", "pve1/200", "pve1/201", "--once", "--json",
                    "--timeout", "20"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 3  # CT 201 is stopped: its agent cannot start
    assert {"version", "taken_at", "runs", "gpus", "hosts", "alerts", "errors"} <= set(payload)
    assert "pve1/201" in payload["errors"] and "pve1/200" not in payload["errors"]
    quiet = next(r for r in payload["runs"] if r["run_id"] == launched["quiet"].run_id)
    for key in ("run_id", "target", "name", "state", "pid", "exit_code", "signal", "created_at", "ended_at",
                "log_path", "last_step", "tok_per_s", "history", "log_tail", "exception_texts", "phase"):
        assert key in quiet
    assert quiet["state"] == "running" and quiet["log_tail"][0] == "Loading dataset from /data..."
    assert len([g for g in payload["gpus"] if g["target"] == "pve1/200"]) == 8


def is_watch_agent(cmdline: list[str]) -> bool:
    """`python .../agent-<digest>.pyz watch ...`: the watch agent as the run client starts it."""
    return any(arg.endswith(".pyz") and cmdline[i + 1:i + 2] == ["watch"] for i, arg in enumerate(cmdline))


def test_closing_the_source_ends_every_agent_and_nvidia_smi(lab, inventory, launched) -> None:
    def leftovers() -> list:
        return [p for p in lab.ct_processes("pve1", 200)
                if is_watch_agent(p.cmdline) or "nvidia-smi" in " ".join(p.cmdline)]

    zombies_before = lab.zombies("pve1", 200)
    with LiveSource(inventory, [inventory.target("pve1/200")], heartbeat_s=1.0) as live:
        assert live.wait_until_answered(30)
        assert leftovers(), "the agent and its nvidia-smi should run while watching"
    deadline = time.monotonic() + 5
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers() == []
    assert lab.lasting_zombies("pve1", 200, besides=zombies_before) == set()  # none left by the watch
