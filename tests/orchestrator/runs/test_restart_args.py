"""What a launch asks the agent for a run's restarts: the policy (the inventory's unless --restart), and for the
bundled trainer `--resume auto` on every restarted attempt, single-node or under torchrun."""
from __future__ import annotations

from pathlib import Path

from orchestrator.inventory.model import parse_inventory
from orchestrator.runs.client import restart_args
from orchestrator.runs.command import node_train_command, train_command
from orchestrator.runs.spec import LaunchSpec

INVENTORY = ("defaults: {restart: on-failure:2}\nhosts:\n  pve1:\n    address: 192.0.2.1\n    restart: never\n"
             "    containers:\n      200: {gpus: 8, restart: on-failure}\n      201: {gpus: 8}\n")


def test_the_most_specific_inventory_policy_applies_unless_restart_is_given():
    inv = parse_inventory(INVENTORY, Path("inventory.yaml"))
    assert inv.target("pve1/200").restart == "on-failure" and inv.target("pve1/201").restart == "never"
    spec = LaunchSpec(target=inv.target("pve1/201"), command=["sleep", "1"], name="s")
    assert restart_args(spec) == ["--restart", "never"]
    spec.restart, spec.restart_backoff, spec.hang_timeout = "on-failure:5", 0.2, 0
    assert restart_args(spec) == ["--restart", "on-failure:5", "--restart-backoff", "0.2", "--hang-timeout", "0"]


def test_a_restarted_trainer_resumes_from_its_newest_checkpoint():
    inv = parse_inventory(INVENTORY, Path("inventory.yaml"))
    target = inv.target("pve1/200")
    for command in (train_command(target, nproc=1, base_dir="/workspace"),
                    train_command(target, nproc=8, base_dir="/workspace"),
                    node_train_command(target, nnodes=2, nproc=8, endpoint="a:1", job_id="j", is_host=True,
                                       local_addr="a", timeout=60, base_dir="/workspace")):
        spec = LaunchSpec(target=target, command=command, name="t", uses_trainer=True)
        assert restart_args(spec)[-2:] == ["--retry-arg=--resume", "--retry-arg=auto"]
        at = command.index("trainer")
        assert command[at - 1:at + 2] == ["-m", "trainer", "train"]  # the trainer's own arguments run to the end
    assert restart_args(LaunchSpec(target=target, command=["python", "train.py"], name="x"))[-1] == "on-failure"
