"""Table cells of a run: what a person reads in the runs table."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.watch.model import RunView
from tui.runcells import MISSING, newest_run, run_cells, run_names


@pytest.mark.parametrize("state, eta", [("running", "1h00m"), ("killed", MISSING), ("succeeded", MISSING),
                                        ("lost", MISSING)])
def test_eta_only_for_runs_still_going(state: str, eta: str) -> None:
    cells = run_cells(RunView(run_id="r1", target="pve1/200", name="r1", state=state, eta_s=3600.0, last_step=7))
    assert cells["eta"].plain.strip() == eta
    assert cells["step"].plain.strip() == "7"


def run(run_id: str, name: str) -> RunView:
    return RunView(run_id=run_id, target="local", name=name, state="running")


def test_the_id_suffix_grows_until_it_tells_the_runs_apart() -> None:
    names = run_names([run("a-0001-beef", "a"), run("a-0002-beef", "a"), run("b-0001", "b"), run("x-1", "")])
    assert names == {"a-0001-beef": "a·1-beef", "a-0002-beef": "a·2-beef", "b-0001": "b", "x-1": "x-1"}


def test_a_long_repeated_name_is_cut_so_that_its_suffix_stays() -> None:
    long = "a-very-long-drafter-run-name"
    names = run_names([run("r-3f2a", long), run("r-9b1c", long)], limit=15)
    assert names["r-3f2a"] == "a-very-lo…·3f2a" and len(names["r-3f2a"]) == 15


def test_newest_run_prefers_a_live_one() -> None:
    old, ended = run("t-261201-100000-aaaa", "t"), dataclasses.replace(run("t-261201-110000-bbbb", "t"), state="lost")
    assert newest_run([old, ended]) is old
    assert newest_run([dataclasses.replace(old, state="killed"), ended]) is ended
    assert newest_run([]) is None


@pytest.mark.parametrize("fields, shown", [
    ({"state": "running", "attempt": 3, "max_attempts": 5}, "running (attempt 3/5)"),
    ({"state": "running", "attempt": 2, "max_attempts": 5, "restart_at": "2026-12-06T03:00:00Z"},
     "running (restarting: attempt 3/5 next)"),
    ({"state": "succeeded", "attempt": 3, "max_attempts": 5}, "succeeded (attempt 3/5)"),
    ({"state": "running", "attempt": 1, "max_attempts": 1}, "running"),  # no restart policy: as before
    # why the supervisor ended it: the watchdog, the crash-loop guard, a kill between two attempts
    ({"state": "failed", "reason": "hung"}, "failed (hung)"),
    ({"state": "failed", "reason": "crash loop", "attempt": 3, "max_attempts": 5}, "failed (crash loop, attempt 3/5)"),
    ({"state": "killed", "reason": "killed during the backoff", "attempt": 1, "max_attempts": 4},
     "killed during the backoff"),
    ({"state": "failed", "reason": "[red]anything else"}, "failed"),
])
def test_the_state_cell_tells_the_attempt_of_a_run_under_a_restart_policy(fields: dict, shown: str) -> None:
    cells = run_cells(RunView(run_id="r1", target="pve1/200", name="r1", **fields))
    assert cells["state"].plain == shown
