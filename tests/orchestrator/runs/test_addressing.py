"""Which runs a RUN argument names (orchestrator/runs/addressing.py), on run records as the agent gives them."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_records.run import RunRecord
from orchestrator.errors import UsageError
from orchestrator.inventory.model import parse_inventory
from orchestrator.runs.addressing import resolve

INV = parse_inventory("hosts:\n  pve1:\n    address: 10.0.0.1\n    containers:\n      200: {gpus: 8}\n",
                      Path("inventory.yaml"))
CT, LOCAL = INV.target("pve1/200"), INV.target("local")


def run(run_id: str, name: str, state: str, created: str, target=LOCAL, **extra) -> tuple:
    return target, RunRecord.from_dict({"run_id": run_id, "name": name, "state": state, "created_at": created,
                                        "job_id": None, **extra})


def node(job_id: str, rank: int, state: str, created: str, target=CT) -> tuple:
    return run(f"{job_id}-n{rank}", "big", state, created, target, job_id=job_id, node_rank=rank, nnodes=2)


RUNS = [
    run("ticker-261201-100000-aaaa", "ticker", "killed", "2026-12-01T10:00:00.000Z"),
    run("ticker-261201-110000-bbbb", "ticker", "running", "2026-12-01T11:00:00.000Z"),
    run("ticker-261201-120000-cccc", "ticker", "failed", "2026-12-01T12:00:00.000Z", CT),
    run("solo-261201-090000-dddd", "solo", "succeeded", "2026-12-01T09:00:00.000Z"),
    node("big-261201-080000-eeee", 0, "running", "2026-12-01T08:00:00.000Z"),
    node("big-261201-080000-eeee", 1, "running", "2026-12-01T08:00:00.100Z", LOCAL),
]


def ids(match) -> list[str]:
    return [record.run_id for _, record in match.runs]


def test_a_name_means_its_newest_live_run_and_says_so():
    match = resolve("ticker", RUNS)
    assert (match.kind, match.id, ids(match)) == ("run", "ticker-261201-110000-bbbb", ["ticker-261201-110000-bbbb"])
    assert "3 runs" in match.note and "newest live" in match.note and match.id in match.note


def test_a_name_with_no_live_run_means_its_newest_and_one_run_needs_no_note():
    ended = [r for r in RUNS if r[1].state != "running"]
    match = resolve("ticker", ended)
    assert match.id == "ticker-261201-120000-cccc" and "none is live" in match.note
    solo = resolve("solo", RUNS)
    assert solo.id == "solo-261201-090000-dddd" and solo.note is None


def test_exact_ids_win_and_a_job_is_every_node():
    assert ids(resolve("ticker-261201-100000-aaaa", RUNS)) == ["ticker-261201-100000-aaaa"]
    job = resolve("big-261201-080000-eeee", RUNS)
    assert job.kind == "job" and ids(job) == ["big-261201-080000-eeee-n0", "big-261201-080000-eeee-n1"]
    by_name = resolve("big", RUNS)
    assert by_name.kind == "job" and len(by_name.runs) == 2
    one_node = resolve("big-261201-080000-eeee-n1", RUNS)
    assert one_node.kind == "run" and ids(one_node) == ["big-261201-080000-eeee-n1"]


def test_a_unique_prefix_names_one_run_or_one_job():
    assert resolve("ticker-261201-12", RUNS).id == "ticker-261201-120000-cccc"
    assert resolve("so", RUNS).id == "solo-261201-090000-dddd"
    assert resolve("big-2612", RUNS).kind == "job"  # the job's id, not its two node ids
    assert resolve("nothing", RUNS) is None


def test_an_ambiguous_prefix_lists_the_candidates():
    with pytest.raises(UsageError) as info:
        resolve("ticker-2612", RUNS)
    message = str(info.value)
    assert "begins 3 run ids" in message
    assert all(r[1].run_id in message for r in RUNS[:3]) and "local" in message and "pve1/200" in message
    with pytest.raises(UsageError, match="begins 2 run ids"):
        resolve("big-261201-080000-eeee-n", RUNS)
