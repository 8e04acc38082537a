"""`launch --queue` and `--gpu-count N` on the controller's side: the usage mistakes refused before anything is
asked or queued, what the agent's launch is asked for (the inventory's `queue:` too), and what a launch says
of a run that waits in its container's queue (the agent's answers from the contract's stand-in)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.inventory.model import parse_inventory
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec, NodePlace
from orchestrator.transports.pool import Connections

from .queue_agent import agent_for, option, queued_run  # noqa: F401  (agent_for: a fixture)

INVENTORY = ("defaults: {queue: true}\nhosts:\n  pve1:\n    address: 192.0.2.1\n    containers:\n"
             "      200: {gpus: 8}\n      201: {queue: false}\n  pve2:\n    address: 192.0.2.2\n    queue: false\n"
             "    containers:\n      300: {gpus: 2, queue: true}\n      301: {gpus: 2}\n")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.parametrize("args, words", [
    (["--gpu-count", "0"], "--gpu-count 0: give a number of GPUs from 1 to"),
    (["--gpu-count", "-1"], "--gpu-count -1: give a number of GPUs from 1 to"),
    (["--gpu-count", "9"], "--gpu-count 9: pve1/200 has 8 GPU(s) (0-7) in the inventory"),
    (["--gpu-count", "2", "--gpus", "0"], "give either --gpus (which GPUs) or --gpu-count"),
    (["--queue", "--force"], "--queue waits for free GPUs, --force starts on GPUs a run holds"),
    (["--gpu-count", "2", "--force"], "--gpu-count waits for free GPUs, --force starts on GPUs a run holds"),
    (["--gpu-count", "2", "--no-queue"], "--gpu-count takes its GPUs through the container's queue"),
])
def test_a_bad_gpu_count_or_combination_is_one_usage_line_and_nothing_is_asked(args, words, inventory, capsys,
                                                                                agent_for):
    agent = agent_for()
    assert main(["--inventory", str(inventory), "launch", "pve1/200", *args, "--", "sleep", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"dflashctl: error: {words}"), captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert agent.commands == []  # nothing asked of the target, nothing queued


def test_a_job_across_targets_is_not_queued(inventory, tmp_path, capsys, agent_for):
    agent = agent_for()
    config = tmp_path / "c.yaml"
    config.write_text("steps: 1\n")
    assert main(["--inventory", str(inventory), "launch", "pve1/200", "pve2/300", "--config", str(config),
                 "--gpu-count", "1"]) == 2
    assert "take one TARGET" in capsys.readouterr().err and agent.commands == []


def test_a_gpu_count_beyond_what_nvidia_smi_lists_is_refused_before_the_agent_is_asked(agent_for, tmp_path):
    """pve1/201 gives no `gpus:`: nvidia-smi's count (8 here) is what --gpu-count is checked against."""
    agent = agent_for(launch=lambda args, target: pytest.fail("a launch was asked for"))
    inv = parse_inventory(INVENTORY, tmp_path / "inventory.yaml")
    spec = LaunchSpec(target=inv.target("pve1/201"), command=["sleep", "1"], name="s", gpu_count=9, queue=True)
    with pytest.raises(Exception) as refused:
        RunClient(inv, Connections()).launch(spec)
    assert refused.value.exit_code == 2 and "--gpu-count 9: pve1/201 has 8 GPU(s) (0-7) that nvidia-smi lists" \
        in str(refused.value)
    assert agent.calls == []


def test_the_inventory_queue_key_is_the_most_specific_one_set(tmp_path):
    inv = parse_inventory(INVENTORY, tmp_path / "inventory.yaml")
    assert [inv.target(name).queue for name in ("pve1/200", "pve1/201", "pve2/300", "pve2/301")] == \
        [True, False, True, False]

    def spec(name: str, **more) -> LaunchSpec:
        return LaunchSpec(target=inv.target(name), command=["true"], name="t", **more)

    assert spec("pve1/200").queued() and not spec("pve1/201").queued()
    assert not spec("pve1/200", queue=False).queued() and spec("pve1/201", queue=True).queued()
    assert not spec("pve1/200", force=True).queued()  # --force starts now: the inventory's queue gives way
    assert not spec("pve1/200", job=NodePlace("j", 0, 2)).queued()  # a job's nodes start together or not at all
    assert spec("pve1/201", gpu_count=2).queued()  # the queue is what picks any N free GPUs


def test_a_queued_launch_asks_the_agent_to_queue_and_says_where_it_waits(inventory, capsys, agent_for):
    record = {}

    def launch(args: list[str], target: str) -> dict:
        record.update(queued_run(option(args, "--run-id"), position=2, gpu_count=int(option(args, "--gpu-count")),
                                 target=option(args, "--target")))
        return {"ok": True, "run": record}

    agent = agent_for(launch=launch)
    assert main(["--inventory", str(inventory), "launch", "pve2/301", "--gpu-count", "2", "--name", "lr3",
                 "--", "sleep", "1"]) == 0
    (args,) = agent.calls
    assert "--queue" in args and option(args, "--gpu-count") == "2" and option(args, "--gpus") is None
    captured = capsys.readouterr()
    assert captured.out.strip() == record["run_id"]
    said = captured.err.splitlines()[-1]
    assert f"{record['run_id']} is queued (2nd) on pve2/301, waiting for 2 GPUs;" in said
    assert "dflashctl ps --queue pve2/301" in said and "all 2 GPUs" not in captured.err


def test_a_queued_launch_naming_gpus_prints_its_record_as_json(inventory, capsys, agent_for):
    agent = agent_for(launch=lambda args, target: {"ok": True, "run": queued_run(option(args, "--run-id"), position=1,
                                                                          gpus=[1])})
    assert main(["--inventory", str(inventory), "launch", "pve2/301", "--queue", "--gpus", "1", "--json",
                 "--", "sleep", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run"]["state"] == "queued" and printed["queue_position"] == 1 and printed["gpus"] == [1]
    assert "--queue" in agent.calls[0]


def test_no_queue_overrides_the_inventory_and_a_started_run_reads_as_before(inventory, capsys, agent_for):
    agent = agent_for(launch=lambda args, target: {"ok": True, "run": {"run_id": option(args, "--run-id"),
                                                               "state": "running", "pid": 4242, "gpus": [0]}})
    assert main(["--inventory", str(inventory), "launch", "pve1/200", "--no-queue", "--gpus", "0",
                 "--", "sleep", "1"]) == 0
    assert "--queue" not in agent.calls[0]
    assert "is running on pve1/200 (pid 4242)" in capsys.readouterr().err
