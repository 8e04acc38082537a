"""The queue's store (SQLite, one writer at a time) and the scheduler's choice, without processes of a run."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

from dflash_agent import queuestore
from dflash_agent.rundir import RunPaths, write_json_atomic
from dflash_agent.runstate import read_state, settle_liveness
from dflash_agent.scheduler import GpuView, fits, plan_turn
from dflash_records.protocol import QUEUED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add(runs_dir: str, run_id: str, gpus=None, gpu_count=None) -> int:
    return queuestore.enqueue(runs_dir, run_id, queued_at="t", gpus=gpus, gpu_count=gpu_count)


def test_first_in_first_out_with_positions_and_removal(tmp_path):
    runs = str(tmp_path / "runs")
    assert queuestore.entries(runs) == [] and not queuestore.has_entries(runs)
    assert [add(runs, "a", gpus=[0]), add(runs, "b", gpu_count=2), add(runs, "c", gpus=[])] == [1, 2, 3]
    assert [e.run_id for e in queuestore.entries(runs)] == ["a", "b", "c"]
    assert queuestore.remove(runs, "a") and not queuestore.remove(runs, "a")
    assert queuestore.positions(runs) == {"b": 1, "c": 2}
    assert add(runs, "a") == 3  # a run queued again goes to the end, never back to its old place
    entry = queuestore.entries(runs)[0]
    assert (entry.gpus, entry.gpu_count) == (None, 2)
    conn = sqlite3.connect(queuestore.db_path(runs))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


ENQUEUE = """
import sys
from dflash_agent import queuestore
runs, name = sys.argv[1], sys.argv[2]
print(queuestore.enqueue(runs, name, queued_at="t", gpus=None, gpu_count=1))
"""


def test_twenty_processes_enqueueing_at_once_get_one_order_none_lost_or_doubled(tmp_path):
    runs = str(tmp_path / "runs")
    add(runs, "first")  # the database exists: the twenty race on the writer lock, not on creating it
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", ENQUEUE, runs, "r{}".format(i)], stdout=subprocess.PIPE,
                              env=env) for i in range(20)]
    places = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    order = [e.run_id for e in queuestore.entries(runs)]
    assert sorted(order[1:]) == sorted("r{}".format(i) for i in range(20)) and len(set(order)) == 21
    # each writer saw its own place, and those places are the final order's
    assert sorted(places) == list(range(2, 22))
    assert {order[place - 1] for place in places} == set(order[1:])


def test_a_named_run_waits_for_its_gpus_ours_or_foreign():
    view = GpuView([0, 1, 2, 3], ours={0}, foreign={3})
    assert fits([1, 2], None, view) == (True, [1, 2])
    assert fits([0], None, view) == (False, [0])
    assert fits([3], None, view)[0] is False
    assert fits([1], None, GpuView([0, 1], ours=set(), ours_all=True))[0] is False


def test_any_n_takes_the_lowest_free_ones_and_none_needs_nothing():
    view = GpuView([0, 1, 2, 3], ours={1}, foreign={2})
    assert fits(None, 2, view) == (True, [0, 3])
    assert fits(None, 3, view) == (False, None)
    assert fits(None, 1, GpuView(None, ours=set())) == (False, None)  # GPUs unknown: any N cannot be chosen
    assert fits([], None, GpuView([0], ours={0}, ours_all=True)) == (True, [])
    # a run without --gpus waits for the whole container
    assert fits(None, None, GpuView([0, 1], ours=set())) == (True, None)
    assert fits(None, None, GpuView([0, 1], ours=set(), foreign={1}))[0] is False


class E:
    def __init__(self, run_id, gpus=None, gpu_count=None):
        self.run_id, self.gpus, self.gpu_count = run_id, gpus, gpu_count


def test_a_turn_is_strictly_first_in_first_out_and_packs_what_it_starts():
    entries = [E("one", gpu_count=1), E("two", gpu_count=1), E("wide", gpu_count=2), E("small", gpu_count=1)]
    states = {e.run_id: QUEUED for e in entries}
    starts, stale = plan_turn(entries, states, GpuView([0, 1, 2], ours=set()))
    # one and two take 0 and 1; wide needs 2 of the 1 left and waits, and small behind it waits for it
    assert [(e.run_id, g) for e, g in starts] == [("one", [0]), ("two", [1])] and stale == []
    states["one"] = "killed"
    starts, stale = plan_turn(entries, states, GpuView([0, 1, 2], ours={1}))
    assert [e.run_id for e in stale] == ["one"]
    assert [(e.run_id, g) for e, g in starts] == [("two", [0])]  # then wide waits: nothing behind it starts


def test_a_queued_run_is_never_lost_when_no_process_runs_for_it(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "waiting")
    os.makedirs(paths.dir)
    write_json_atomic(paths.run_json, {"run_id": "waiting", "command": ["true"], "created_ts": 0})
    write_json_atomic(paths.state_json, {"state": QUEUED, "queued_at": "t"})
    assert settle_liveness(paths) == (read_state(paths), False)
    assert json.load(open(paths.state_json))["state"] == QUEUED
