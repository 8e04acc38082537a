"""A sweep on the dashboard (its runs together, ranked by newest held-out τ then tok/s) and `queue_drained`: a
target's queue emptied by a start, a sweep whose runs all ended; what reaches a notification destination."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.alertkinds import DEFAULT_KINDS, QUEUE_DRAINED
from orchestrator.notify.destinations import Destination
from orchestrator.notify.policy import NotifyPolicy
from orchestrator.watch.drain import QueueDrain
from orchestrator.watch.model import AlertFeed, RunView
from orchestrator.watch.sweeprows import group_sweeps


def view(run_id: str, sweep: str | None = None, tau: float | None = None, tok: float | None = None) -> RunView:
    return RunView(run_id=run_id, target="t", name=run_id, state="running", sweep_id=sweep, tau_heldout=tau,
                   tok_per_s=tok)


def test_a_sweeps_runs_sit_together_at_its_first_runs_place_best_first():
    rows = [view("a"), view("s1", "S", 1.5, 900), view("b"), view("s2", "S", 2.0, 800), view("s3", "S", 2.0, 950),
            view("s4", "S")]
    shown = group_sweeps(rows)
    assert [v.run_id for v in shown] == ["a", "s3", "s2", "s1", "s4", "b"]
    assert [v.sweep_rank for v in shown] == [None, 1, 2, 3, 4, None]


def run(run_id: str, state: str, sweep: str | None = None) -> RunRecord:
    return RunRecord(run_id=run_id, state=state, sweep_id=sweep, created_at=run_id)


def test_a_targets_queue_drains_when_its_last_queued_run_starts_not_when_it_is_killed():
    drain = QueueDrain()
    assert drain.observe_target("pve1/200", [run("a", "running"), run("b", "queued"), run("c", "queued")], 0) == []
    assert drain.observe_target("pve1/200", [run("a", "succeeded"), run("b", "running"), run("c", "queued")], 1) == []
    said = drain.observe_target("pve1/200", [run("a", "succeeded"), run("b", "running"), run("c", "starting")], 2)
    assert [(a.kind, a.target, a.run_id) for a in said] == [(QUEUE_DRAINED, "pve1/200", None)]
    assert "c started, no run is left queued" in said[0].message
    assert drain.observe_target("pve1/200", [run("c", "running")], 3) == []  # said once
    assert drain.observe_target("pve2/300", [run("x", "queued")], 4) == []
    assert drain.observe_target("pve2/300", [run("x", "killed")], 5) == []  # emptied by hand: no news
    first_look = QueueDrain()  # what was empty when the watch began is no news
    assert first_look.observe_target("pve1/200", [run("a", "running")], 0) == []


def test_a_sweep_drains_when_its_runs_have_all_ended_once_while_watched():
    drain = QueueDrain()
    live = [("t1", run("s1", "succeeded", "S")), ("t2", run("s2", "running", "S")), ("t1", run("o", "running")),
            ("t1", run("old1", "failed", "OLD"))]
    assert drain.observe_sweeps(live, 0) == []
    ended = [("t1", run("s1", "succeeded", "S")), ("t2", run("s2", "failed", "S")), ("t1", run("o", "running")),
             ("t1", run("old1", "failed", "OLD"))]
    said = drain.observe_sweeps(ended, 1)
    assert [(a.kind, a.sweep_id, a.run_id, a.target) for a in said] == [(QUEUE_DRAINED, "S", None, None)]
    assert "all 2 runs ended (1 failed, 1 succeeded)" in said[0].message and "sweep report S" in said[0].message
    assert drain.observe_sweeps(ended, 2) == []


def test_a_drained_queue_is_notified_by_default_to_every_destination_that_wants_it():
    drain = QueueDrain()
    drain.observe_sweeps([("t", run("s1", "running", "S"))], 0)
    alert = drain.observe_sweeps([("t", run("s1", "succeeded", "S"))], 1)[0]
    wants = Destination(url="json://a", kinds=frozenset(DEFAULT_KINDS), repeat_s=600, plugin=None)
    not_it = Destination(url="json://b", kinds=frozenset({"failed"}), repeat_s=600, plugin=None)
    policy = NotifyPolicy([wants, not_it])
    sent = policy.observe(AlertFeed(cursor=1, version=1, alerts=(alert,), backlog=(False,)), 10.0)
    assert [(m.destination, m.kind, m.title) for m in sent] == [(wants, QUEUE_DRAINED,
                                                                 "dflashctl: sweep S: queue drained")]
    assert policy.observe(AlertFeed(cursor=1, version=1, alerts=(alert,), backlog=(True,)), 11.0) == []
