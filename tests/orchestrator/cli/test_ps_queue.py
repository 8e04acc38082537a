"""ps of queued runs: `queued (2nd) for GPU 1` in the STATE column, and `ps --queue`: each target's queue from
its agent's `queue` answer (the contract's stand-in), in the table and in `--json`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_records.queueinfo import QueueAnswer
from orchestrator.cli import main
from orchestrator.inventory.model import parse_inventory
from orchestrator.runs.client import RunClient
from orchestrator.transports.pool import Connections

from .queue_agent import agent_for, queued_run  # noqa: F401  (agent_for: a fixture)

INVENTORY = ("hosts:\n  pve1:\n    address: 192.0.2.1\n    containers:\n      200: {gpus: 4}\n"
             "      201: {gpus: 4}\n")
QUEUE = {"ok": True, "resumes_at_boot": True, "gpus_total": 4, "gpus_free": [], "gpus_ours": [0, 1, 2], "gpus_foreign": [3],
         "queued": [{"run_id": "lr1-260501-120000-aaaa", "position": 1, "name": "lr1", "gpu_count": 2,
                     "queued_at": "2026-05-01T12:00:00.000Z"},
                    {"run_id": "lr3-260501-120001-bbbb", "position": 2, "name": "lr3", "gpus": [1],
                     "queued_at": "2026-05-01T12:00:01.000Z", "sweep_id": "sw-1"}]}
EMPTY = {"ok": True, "gpus_total": 4, "gpus_free": [0, 1, 2, 3], "gpus_ours": [], "gpus_foreign": [], "queued": []}


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    monkeypatch.setenv("COLUMNS", "200")
    return path


def test_ps_shows_a_queued_runs_place_and_what_it_waits_for(inventory, capsys, agent_for):
    runs = [queued_run("lr1-260501-120000-aaaa", position=1, gpu_count=2),
            queued_run("lr3-260501-120001-bbbb", position=2, gpus=[1]),
            queued_run("all-260501-120002-cccc", position=3)]
    agent_for(ps=lambda args, target: {"ok": True, "runs": runs})
    assert main(["--inventory", str(inventory), "ps", "pve1/200"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "queued (1st) for 2 GPUs" in lines["lr1-260501-120000-aaaa"]
    assert "queued (2nd) for GPU 1" in lines["lr3-260501-120001-bbbb"]
    assert "queued (3rd) for every GPU" in lines["all-260501-120002-cccc"]


def test_ps_queue_lists_each_targets_queue_in_order(inventory, capsys, agent_for):
    agent = agent_for(queue=lambda args, target: QUEUE if target == "pve1/200" else EMPTY)
    assert main(["--inventory", str(inventory), "ps", "--queue", "pve1/200", "pve1/201"]) == 0
    out = capsys.readouterr().out
    assert sorted(agent.subcommands()) == ["queue", "queue"]  # one call per target
    head, *rest = out.splitlines()
    assert head == ("pve1/200: 4 GPUs: free none; our runs hold 0-2; another process holds 3; 2 queued; "
                    "resumed at boot")
    rows = [line.split() for line in rest if "-2605" in line]
    assert [row[:3] for row in rows] == [["1st", "lr1-260501-120000-aaaa", "lr1"],
                                         ["2nd", "lr3-260501-120001-bbbb", "lr3"]]
    assert "2 GPUs" in " ".join(rows[0]) and "GPU 1" in " ".join(rows[1])
    assert "pve1/201: 4 GPUs: free 0-3; nothing queued" in out


def test_ps_queue_says_a_queue_waits_for_the_next_call_after_a_reboot_where_nothing_resumes_it_at_boot(
        inventory, capsys, agent_for):
    agent_for(queue=lambda args, target: dict(QUEUE, resumes_at_boot=False))
    assert main(["--inventory", str(inventory), "ps", "--queue", "pve1/200"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        "; 2 queued; after a reboot, resumed at the next dflashctl call")


def test_ps_queue_json_gives_every_targets_answer_and_says_which_were_not_read(inventory, capsys, agent_for):
    agent_for(queue=lambda args, target: QUEUE if target == "pve1/200" else
              {"ok": False, "error": "queue database is locked"})
    assert main(["--inventory", str(inventory), "ps", "--queue", "--json", "pve1/200", "pve1/201"]) == 1
    captured = capsys.readouterr()
    targets = json.loads(captured.out)["targets"]
    assert targets["pve1/200"]["ok"] and [r["position"] for r in targets["pve1/200"]["queued"]] == [1, 2]
    assert targets["pve1/200"]["queued"][1]["sweep_id"] == "sw-1"
    assert targets["pve1/201"]["ok"] is False and targets["pve1/201"]["error"] == "queue database is locked"
    assert "dflashctl: error: pve1/201: queue not read: queue database is locked" in captured.err


def test_run_client_queue_is_one_agent_call_typed(agent_for, tmp_path):
    agent = agent_for(queue=lambda args, target: QUEUE)
    inv = parse_inventory(INVENTORY, tmp_path / "inventory.yaml")
    answer = RunClient(inv, Connections()).queue(inv.target("pve1/200"))
    assert isinstance(answer, QueueAnswer) and answer.gpus_foreign == (3,)
    assert [(run.position, run.gpu_count, run.gpus) for run in answer.queued] == [(1, 2, None), (2, None, (1,))]
    assert agent.calls == [["queue", "--runs-dir", "/workspace/.dflash/runs"]]


def test_kill_of_a_queued_run_takes_it_out_of_the_queue_and_says_nothing_started(inventory, capsys, agent_for):
    """`kill NAME` picks the queued run over an older ended one of its name; the agent's kill has no process to
    signal (the contract: it marks the run killed and removes it from the queue), and the CLI says so."""
    waiting = queued_run("lr3-260501-120001-bbbb", position=1, gpus=[1], target="pve1/200")
    older = {"run_id": "lr3-260430-120000-aaaa", "name": "lr3", "state": "failed", "exit_code": 1,
             "created_at": "2026-04-30T12:00:00.000Z", "ended_at": "2026-04-30T13:00:00.000Z"}

    def kill(args: list[str], target: str) -> dict:
        assert args[args.index("--run-id") + 1:] == [waiting["run_id"]] and target == "pve1/200"
        ended = {**waiting, "state": "killed", "queue_position": None, "ended_at": "2026-05-01T12:05:00.000Z",
                 "error": "killed while queued"}  # the agent's words (dflash_agent/queuelaunch.py)
        # what the agent answers (dflash_agent/kill.py): it was queued, not ended
        return {"ok": True, "runs": [{"run_id": waiting["run_id"], "ok": True, "state": "killed", "run": ended,
                                      "was_queued": True, "already_ended": False}]}

    agent = agent_for(ps=lambda args, target: {"ok": True, "runs": [older, waiting] if target == "pve1/200" else []},
                      kill=kill)
    assert main(["--inventory", str(inventory), "kill", "lr3"]) == 0
    captured = capsys.readouterr()
    assert "kill" in agent.subcommands()
    assert "taking 1 queued run out of the queue" in captured.err and "TERM" not in captured.err
    assert "queued on pve1/200" in captured.err  # which of the two runs named lr3 it took
    assert captured.out.strip() == (f"{waiting['run_id']} on pve1/200: killed while queued; nothing of it had "
                                    f"started, and it never will")
