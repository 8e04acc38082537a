"""The watch's `restarted` alert: one per attempt the supervisor started, with why the one before ended; and the
crash loop told once, in the run's ended alert."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.alertkinds import DEFAULT_KINDS
from orchestrator.notify.destinations import Destination
from orchestrator.notify.kinds import notify_kind
from orchestrator.notify.policy import NotifyPolicy
from orchestrator.alertkinds import ENDED, EXCEPTION, RESTARTED
from orchestrator.watch.alerts import RunHealth
from orchestrator.watch.model import AlertFeed
from orchestrator.watch.trackers import RunTracker, alert_view

FIRST = {"attempt": 1, "exit_code": 3, "signal": None, "reason": "failed", "exception": "RuntimeError: CUDA error"}


def record(attempt: int, state: str = "running", **extra) -> dict:
    attempts = [dict(FIRST, attempt=n) for n in range(1, attempt)] + [{"attempt": attempt, "reason": None}]
    return {"state": state, "attempt": attempt, "max_attempts": 5, "attempts": attempts, **extra}


def run_record(attempt: int, state: str = "running", **extra) -> RunRecord:
    return RunRecord.from_dict(record(attempt, state, **extra))


def test_each_new_attempt_raises_one_restarted_alert():
    health = RunHealth("r1")
    assert health.observe_state("running", 0, record=run_record(1)) == []
    alerts = health.observe_state("running", 1, record=run_record(2))
    assert [(a.kind, a.message) for a in alerts] == [
        (RESTARTED, "restarted: attempt 2/5 after attempt 1 failed with exit code 3 (RuntimeError: CUDA error)")]
    assert health.observe_state("running", 2, record=run_record(2)) == []  # the same attempt again: nothing new
    assert [a.kind for a in health.observe_state("running", 3, record=run_record(3))] == [RESTARTED]
    assert notify_kind(RESTARTED, "running") == "restarted" and "restarted" in DEFAULT_KINDS


def test_the_attempt_a_watch_first_finds_is_no_restart():
    health = RunHealth("r1")
    assert health.observe_state("running", 0, record=run_record(3)) == []


def test_a_crash_loop_is_one_ended_alert_that_names_it():
    health = RunHealth("r1")
    health.observe_state("running", 0, record=run_record(3))
    alerts = health.observe_state("failed", 1, record=run_record(
        3, "failed", exit_code=3, reason="crash loop", error="crash loop: RuntimeError: CUDA error"))
    assert [(a.kind, a.message) for a in alerts] == [
        (ENDED, "run failed, exit code 3: crash loop: RuntimeError: CUDA error")]


def test_the_ended_alert_says_how_the_run_ended_as_ps_does():
    health = RunHealth("r1")
    killed = run_record(1, "killed", signal=15, signal_name="SIGTERM")
    assert [a.message for a in health.observe_state("killed", 0, record=killed)] == \
        [f"run {killed.ended_text()}"] == ["run killed, signal 15 (SIGTERM)"]


def test_a_kill_during_the_backoff_is_named_in_the_ended_alert():
    health = RunHealth("r1")
    health.observe_state("running", 0, record=run_record(1, restart_at="2026-12-07T05:00:00Z"))
    why = "killed during the backoff (attempt 2/5 was next)"
    alerts = health.observe_state("killed", 1,
                                  record=run_record(1, "killed", reason="killed during the backoff", error=why))
    assert [(a.kind, a.message) for a in alerts] == [(ENDED, f"run killed: {why}")]


# a failed attempt as its log holds it: the workload's traceback, then the supervisor's own line about it (the one
# tests/dflash_agent/test_restart.py sees a real supervisor write)
FAILED_ATTEMPT = (b"[1s] step=1 loss=2.0\n"
                  b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    step()\n"
                  b"RuntimeError: CUDA error\n"
                  b"dflash: attempt 1/5 failed with exit code 3 (RuntimeError: CUDA error); restarting in 0.2s\n")


def test_the_supervisors_restart_line_is_not_the_workloads_exception():
    tracker = RunTracker("pve1/200", RunRecord.from_dict({"run_id": "r1", **record(1)}), history=10, tail=10)
    alerts = tracker.update_record(RunRecord.from_dict({"run_id": "r1", **record(1)}), 0)
    alerts += tracker.feed(0, 1, FAILED_ATTEMPT, 1) + tracker.settle(2)
    alerts += tracker.update_record(RunRecord.from_dict({"run_id": "r1", **record(2)}), 3)
    assert [a.kind for a in alerts] == [EXCEPTION, RESTARTED], [a.message for a in alerts]
    view = tracker.view()
    assert view.exceptions == 1 and [text.splitlines()[-1] for text in view.exception_texts] == [
        "RuntimeError: CUDA error"]
    destination = Destination("json://localhost", frozenset(DEFAULT_KINDS), 600.0, plugin=None)
    feed = AlertFeed(cursor=2, version=1, alerts=tuple(alert_view(a, "pve1/200") for a in alerts),
                     runs={"r1": tracker.status()})
    bodies = {message.kind: message.body.splitlines()[0] for message in NotifyPolicy([destination]).observe(feed, 4)}
    assert bodies[RESTARTED] == ("restarted: attempt 2/5 after attempt 1 failed with exit code 3 "
                                 "(RuntimeError: CUDA error)")
