"""`launch --anywhere`: which targets are asked, where the run goes and what is said of it, and the usage mistakes.

The agents' answers are a stand-in (RunClient.agent, the one call every agent subcommand goes through): the
decision's rules are tested on their own (tests/orchestrator/runs/test_placement.py); here, that the command
asks each candidate once, launches queued on the chosen one with --gpu-count, and says where and why.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_records.queueinfo import QueueAnswer, QueuedRun
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
      201: {gpus: 8}
  pve2:
    address: 192.0.2.2
    containers:
      300: {gpus: 2}
  pve3:
    address: 192.0.2.3
    containers:
      400: {gpus: 2}
"""


def box(total: int, free: int, waiting: int = 0) -> QueueAnswer:
    return QueueAnswer(ok=True, gpus_total=total, gpus_free=tuple(range(total - free, total)),
                       gpus_ours=tuple(range(total - free)),
                       queued=tuple(QueuedRun(run_id=f"q{i}", position=i + 1) for i in range(waiting)))


@pytest.fixture
def inv(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    return str(tmp_path / "inventory.yaml")


def fleet_of(monkeypatch, answers: dict) -> Fleet:
    fleet = Fleet({"local": QueueAnswer(ok=True, gpus_total=0), **answers})
    monkeypatch.setattr(RunClient, "agent", lambda client, target, args, **kw: fleet.agent(client, target, args, **kw))
    return fleet


def test_the_run_is_launched_queued_where_it_packs_and_the_line_says_why(inv, monkeypatch, capsys):
    fleet = fleet_of(monkeypatch, {"pve1/200": box(2, 2), "pve1/201": box(8, 8), "pve2/300": box(2, 1),
                                   "pve3/400": Unreachable("cannot connect to 192.0.2.3:22: timed out")})
    code, report, err = run_cli(inv, "launch", "--anywhere", "--gpu-count", "1", "--json", "--", "true",
                                capsys=capsys)
    assert code == 0, err
    assert fleet.asked("queue") == ["local", "pve1/200", "pve1/201", "pve2/300", "pve3/400"]  # each once
    [(where, args)] = [(name, args) for name, args in fleet.calls if args[0] == "launch"]
    assert where == "pve2/300" and "--queue" in args and args[args.index("--gpu-count") + 1] == "1"
    assert args[args.index("--") + 1:] == ["true"]
    reason = ("pve2/300: 1 of 2 GPUs free (packed onto a partly used container; pve1/200 has 2 free; pve1/201 has "
              "8 free); skipped: pve3/400 (unreachable: cannot connect to 192.0.2.3:22: timed out), local (has 0 "
              "GPUs)")
    assert report["placement"] == {"target": "pve2/300", "reason": reason}
    assert report["run"]["target"] == "pve2/300"
    assert f"placing on {reason}\n" in err


def test_hosts_narrows_the_candidates_and_a_full_fleet_queues_where_the_queue_is_shortest(inv, monkeypatch, capsys):
    fleet = fleet_of(monkeypatch, {"pve1/200": box(2, 0, waiting=2), "pve1/201": box(8, 0, waiting=1),
                                   "pve2/300": box(2, 0), "pve3/400": box(2, 0, waiting=1)})
    code, report, err = run_cli(inv, "launch", "--anywhere", "--hosts", "pve1", "--gpu-count", "2", "--json",
                                "--", "true", capsys=capsys)
    assert code == 0, err
    assert fleet.asked("queue") == ["pve1/200", "pve1/201"] and fleet.asked("launch") == ["pve1/201"]
    assert report["placement"]["reason"] == ("pve1/201: no target has 2 GPUs free; its queue is shortest "
                                             "(1 waiting); next: pve1/200 (2 waiting, 0 free)")
    assert report["run"]["state"] == "queued"
    fleet.calls.clear()
    code, _, err = run_cli(inv, "launch", "--anywhere", "--hosts", "pve[23]/*", "--gpu-count", "1", "--", "true",
                           capsys=capsys)
    assert code == 0, err
    assert fleet.asked("queue") == ["pve2/300", "pve3/400"]
    assert "placing on pve2/300: no target has 1 GPU free; its queue is shortest (0 waiting); next: pve3/400" in err


@pytest.mark.parametrize("answers, code, words", [
    ({"pve1/200": box(2, 2), "pve1/201": box(8, 8), "pve2/300": box(2, 2), "pve3/400": box(2, 2)}, 2,
     "--anywhere: no target can take a run of 9 GPUs: pve1/200 (has 2 GPUs), pve1/201 (has 8 GPUs), pve2/300 (has "
     "2 GPUs), pve3/400 (has 2 GPUs), local (has 0 GPUs)"),
    ({"pve1/200": box(2, 2), "pve1/201": Unreachable("host key changed"), "pve2/300": box(2, 2),
      "pve3/400": box(2, 2)}, 3, "pve1/201 (unreachable: host key changed)"),
])
def test_when_no_target_can_take_the_run_nothing_is_launched(inv, monkeypatch, capsys, answers, code, words):
    fleet = fleet_of(monkeypatch, answers)
    got, _, err = run_cli(inv, "launch", "--anywhere", "--gpu-count", "9", "--", "true", capsys=capsys)
    assert got == code and err.startswith("dflashctl: error: --anywhere: ") and words in err, err
    assert len(err.strip().splitlines()) == 1 and fleet.asked("launch") == []


@pytest.mark.parametrize("args, words", [
    (["--anywhere", "--gpu-count", "1", "pve1/200", "--", "true"], "--anywhere chooses the target: give no TARGET"),
    (["--anywhere", "--gpu-count", "1", "pve1/200", "pve2/300"], "give no TARGET (pve1/200)"),
    (["--anywhere", "--", "true"], "--anywhere needs --gpu-count N"),
    (["--hosts", "pve*", "pve1/200", "--", "true"], "--hosts chooses among the targets of --anywhere"),
    (["--anywhere", "--gpu-count", "1", "--gpus", "0", "--", "true"], "--gpus names GPUs of one TARGET"),
    (["--anywhere", "--gpu-count", "1", "--each", "--", "true"], "--each starts one on each TARGET"),
    (["--anywhere", "--gpu-count", "1", "--hosts", "pve9*", "--", "true"], "--hosts: no target matches 'pve9*'"),
    (["--anywhere", "--gpu-count", "1"], "nothing to run"),
    (["--anywhere", "--gpu-count", "0", "--", "true"], "--gpu-count 0: give a number of GPUs from 1"),
    (["--anywhere", "--gpu-count", "-1", "--", "true"], "--gpu-count -1: give a number of GPUs from 1"),
    ([], "no TARGET"),
])
def test_bad_usage_is_one_line_and_nothing_is_asked(inv, monkeypatch, capsys, args, words):
    fleet = fleet_of(monkeypatch, {})
    code, out, err = run_cli(inv, "launch", *args, capsys=capsys)
    assert code == 2 and err.startswith("dflashctl: error: ") and words in err.splitlines()[0], err
    assert fleet.calls == [] and out == ""
