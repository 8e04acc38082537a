"""Placement across the fleet on the lab, through the real CLI: three containers of two GPUs each (the fake
nvidia-smi), the real agent's queue in each; a 2-GPU run waits while 1-GPU runs pack around it."""
from __future__ import annotations

import json

import pytest

from tests.lab.workloads import GATED, run_cli
from tests.polling import wait_for

pytestmark = pytest.mark.lab
BOXES = (("pve1", 420), ("pve1", 421), ("pve2", 422))   # A, B, C in the inventory's order
A, B, C = (f"{host}/{ctid}" for host, ctid in BOXES)
FLEET = "*/42?"   # --hosts: these three alone (the lab's other containers have GPUs too)


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    with lab.more_containers(BOXES, tmp_path_factory.mktemp("inv") / "inventory.yaml", gpus=2) as inventory:
        yield str(inventory)


def box_of(target: str) -> tuple[str, int]:
    host, ctid = target.split("/")
    return host, int(ctid)


def on_disk(lab, target: str, run_id: str, name: str) -> dict:
    host, ctid = box_of(target)
    try:
        return json.loads((lab.hosts[host].containers[ctid].workspace / ".dflash" / "runs" / run_id / name)
                          .read_text())
    except (OSError, ValueError):
        return {}


def launch(inv: str, capsys, *where: str, gpu_count: int) -> dict:
    code, report, err = run_cli(inv, "launch", *where, "--gpu-count", str(gpu_count), "--json", "--", "sh", "-c",
                                GATED, capsys=capsys)
    assert code == 0, err
    return report


def test_a_two_gpu_run_waits_while_one_gpu_runs_pack_around_it(lab, inv, capsys):
    held = {target: launch(inv, capsys, target, gpu_count=1) for target in (A, B, C)}  # one GPU of each in use
    assert [r["state"] for r in held.values()] == ["running"] * 3, held
    wide = launch(inv, capsys, "--anywhere", "--hosts", FLEET, gpu_count=2)
    assert (wide["placement"]["target"], wide["run"]["state"]) == (A, "queued"), wide
    assert wide["placement"]["reason"].startswith(f"{A}: no target has 2 GPUs free; its queue is shortest")
    narrow = [launch(inv, capsys, "--anywhere", "--hosts", FLEET, gpu_count=1) for _ in range(2)]
    # A's free GPU is behind the wide run in its queue: the narrow runs go to B, then C, and start there
    assert [(n["placement"]["target"], n["run"]["state"]) for n in narrow] == [(B, "running"), (C, "running")]
    assert "packed onto a partly used container" in narrow[0]["placement"]["reason"], narrow
    code, queues, err = run_cli(inv, "ps", "--queue", A, "--json", capsys=capsys)
    assert code == 0, err
    answer = queues["targets"][A]
    assert answer["gpus_free"] == [1] and [q["run_id"] for q in answer["queued"]] == [wide["run_id"]], queues
    assert on_disk(lab, A, wide["run_id"], "state.json")["state"] == "queued"

    lab.open_gate(*box_of(A), held[A]["run_id"])  # A's run ends: the wide run starts there, on both GPUs
    assert wait_for(lambda: on_disk(lab, A, wide["run_id"], "state.json").get("state") == "running", 30), \
        on_disk(lab, A, wide["run_id"], "state.json")
    assert on_disk(lab, A, wide["run_id"], "run.json")["gpus"] == [0, 1]
    for target, run_id in [(A, wide["run_id"]), (B, held[B]["run_id"]), (C, held[C]["run_id"]),
                           (B, narrow[0]["run_id"]), (C, narrow[1]["run_id"])]:
        lab.open_gate(*box_of(target), run_id)
    assert wait_for(lambda: on_disk(lab, A, wide["run_id"], "state.json").get("state") == "succeeded", 30)
