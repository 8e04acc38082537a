"""`dflashctl sweep` launches queued: every run asks its container's queue (--gpu-count N, or the whole target),
carries the trainer's check for its turn, and `--anywhere` places the grid's runs one after the other from one
round of queue answers. The agents are a stand-in (RunClient.agent, the one call every agent subcommand goes
through); the placement rules are tested on their own (tests/orchestrator/runs/test_placement.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dflash_records.queueinfo import QueueAnswer
from orchestrator.errors import Unreachable
from orchestrator.runs.client import RunClient
from tests.lab.workloads import run_cli
from tests.orchestrator.cli.queue_agent import Fleet

# addresses of TEST-NET-1: never reached (every agent call is answered by the stand-in)
INVENTORY = """hosts:
  pve1:
    address: 192.0.2.1
    containers:
      200: {gpus: 2}
      201: {gpus: 2}
  pve2:
    address: 192.0.2.2
    containers:
      300: {gpus: 4}
"""


def box(total: int, free: int) -> QueueAnswer:
    return QueueAnswer(ok=True, gpus_total=total, gpus_free=tuple(range(total - free, total)),
                       gpus_ours=tuple(range(total - free)))


@pytest.fixture
def inv(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    return str(tmp_path / "inventory.yaml")


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"target_path": str(tmp_path), "data_path": str(tmp_path / "data"),
                                    "output_dir": str(tmp_path / "out")}))
    return str(path)


def fleet_of(monkeypatch, answers: dict) -> Fleet:
    fleet = Fleet(answers)
    monkeypatch.setattr(RunClient, "agent", lambda client, target, args, **kw: fleet.agent(client, target, args, **kw))
    return fleet


def test_a_grid_of_more_runs_than_free_gpus_queues_the_rest_each_with_its_check(inv, config, monkeypatch, capsys):
    fleet = fleet_of(monkeypatch, {"pve1/200": box(2, 2), "pve2/300": box(4, 1)})
    code, report, err = run_cli(inv, "sweep", config, "--set", "seed=0,1,2,3,4", "--gpu-count", "1", "--json",
                                "pve1/200", "pve2/300", capsys=capsys)
    assert code == 0, err
    launches = fleet.launches()
    assert len(launches) == 5
    for _, args in launches:
        head = args[:args.index("--")]
        assert "--queue" in head and head[head.index("--gpu-count") + 1] == "1"
        check = json.loads(head[head.index("--check") + 1])  # the trainer's check, kept for the run's turn
        assert check[1:4] == ["-m", "trainer", "check"] and head[head.index("--check-input") + 1] == "config.yaml"
    states = {(r["target"], r["state"]) for r in report["runs"]}
    assert [r["state"] for r in report["runs"]] == ["running", "running", "running", "queued", "queued"], report
    assert states == {("pve1/200", "running"), ("pve2/300", "running"), ("pve1/200", "queued"),
                      ("pve2/300", "queued")}


def test_anywhere_places_the_grid_one_run_after_the_other_from_one_round_of_answers(inv, config, monkeypatch,
                                                                                     capsys):
    fleet = fleet_of(monkeypatch, {"pve1/200": box(2, 1), "pve1/201": box(2, 2), "pve2/300": box(4, 4),
                                   "local": Unreachable("no such host")})
    code, report, err = run_cli(inv, "sweep", config, "--set", "seed=0,1,2,3,4,5", "--gpu-count", "1",
                                "--anywhere", "--hosts", "pve*", "--json", capsys=capsys)
    assert code == 0, err
    asked = sorted(name for name, args in fleet.calls if args[0] == "queue")
    assert asked == ["pve1/200", "pve1/201", "pve2/300"]  # each once, for the whole grid
    where = [r["target"] for r in report["runs"]]
    assert where == ["pve1/200", "pve1/201", "pve1/201", "pve2/300", "pve2/300", "pve2/300"]
    for target in set(where):  # each target's runs launched in the grid's order
        ids = [args[args.index("--run-id") + 1] for name, args in fleet.launches() if name == target]
        assert ids == [r["run_id"] for r in report["runs"] if r["target"] == target]
    reasons = [r["placement"]["reason"] for r in report["runs"]]
    assert [r["placement"]["target"] for r in report["runs"]] == where
    assert reasons[0].startswith("pve1/200: 1 of 2 GPUs free (packed onto a partly used container")
    assert reasons[2].startswith("pve1/201: 1 of 2 GPUs free (packed onto a partly used container")
    lines = [line for line in err.splitlines() if ": placing on " in line]
    assert [line.split(": placing on ", 1)[1] for line in lines] == reasons  # one line each, on stderr
    checked = sorted(name for name, args in fleet.calls if args[0] == "check")
    assert checked == sorted(where)  # the trainer's check on each chosen target, every run's config


@pytest.mark.parametrize("args, words", [
    (["--anywhere"], "--anywhere needs --gpu-count N"),
    (["--gpu-count", "0", "pve1/200"], "--gpu-count 0: give a number of GPUs from 1"),
    (["--gpu-count", "-1", "pve1/200"], "--gpu-count -1: give a number of GPUs from 1"),
    (["--gpu-count", "3", "pve1/200"], "--gpu-count 3: pve1/200 has 2 GPU(s)"),
    (["--gpu-count", "1", "--gpus", "0", "pve1/200"], "give either --gpus (which GPUs) or --gpu-count"),
    (["--gpu-count", "5", "--anywhere"], "--anywhere: no target can take a run of 5 GPUs"),
])
def test_a_bad_gpu_count_is_one_line_and_nothing_is_launched(inv, config, monkeypatch, capsys, args, words):
    fleet = fleet_of(monkeypatch, {"pve1/200": box(2, 2), "pve1/201": box(2, 2), "pve2/300": box(4, 4),
                                   "local": box(0, 0)})
    code, out, err = run_cli(inv, "sweep", config, "--set", "seed=0,1", *args, capsys=capsys)
    assert code == 2 and out == "" and err.startswith("dflashctl: error: ") and words in err, err
    assert len(err.strip().splitlines()) == 1 and fleet.launches() == []
