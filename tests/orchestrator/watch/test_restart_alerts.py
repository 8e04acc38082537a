"""The watch's `restarted` alert: one per attempt the supervisor started, with why the one before ended; and the
crash loop told once, in the run's ended alert."""
from __future__ import annotations

from orchestrator.alertkinds import DEFAULT_KINDS
from orchestrator.notify.kinds import notify_kind
from orchestrator.alertkinds import ENDED, RESTARTED
from orchestrator.watch.alerts import RunHealth

FIRST = {"attempt": 1, "exit_code": 3, "signal": None, "reason": "failed", "exception": "RuntimeError: CUDA error"}


def record(attempt: int, state: str = "running", **extra) -> dict:
    attempts = [dict(FIRST, attempt=n) for n in range(1, attempt)] + [{"attempt": attempt, "reason": None}]
    return {"state": state, "attempt": attempt, "max_attempts": 5, "attempts": attempts, **extra}


def test_each_new_attempt_raises_one_restarted_alert():
    health = RunHealth("r1")
    assert health.observe_state("running", 0, record=record(1)) == []
    alerts = health.observe_state("running", 1, record=record(2))
    assert [(a.kind, a.message) for a in alerts] == [
        (RESTARTED, "restarted: attempt 2/5 after attempt 1 failed with exit code 3 (RuntimeError: CUDA error)")]
    assert health.observe_state("running", 2, record=record(2)) == []  # the same attempt again: nothing new
    assert [a.kind for a in health.observe_state("running", 3, record=record(3))] == [RESTARTED]
    assert notify_kind(RESTARTED, "running") == "restarted" and "restarted" in DEFAULT_KINDS


def test_the_attempt_a_watch_first_finds_is_no_restart():
    health = RunHealth("r1")
    assert health.observe_state("running", 0, record=record(3)) == []


def test_a_crash_loop_is_one_ended_alert_that_names_it():
    health = RunHealth("r1")
    health.observe_state("running", 0, record=record(3))
    alerts = health.observe_state("failed", 1, exit_code=3, record=record(
        3, "failed", reason="crash loop", error="crash loop: RuntimeError: CUDA error"))
    assert [(a.kind, a.message) for a in alerts] == [
        (ENDED, "run failed (exit code 3): crash loop: RuntimeError: CUDA error")]


def test_a_kill_during_the_backoff_is_named_in_the_ended_alert():
    health = RunHealth("r1")
    health.observe_state("running", 0, record=record(1, restart_at="2026-12-07T05:00:00Z"))
    why = "killed during the backoff (attempt 2/5 was next)"
    alerts = health.observe_state("killed", 1, record=record(1, "killed", reason="killed during the backoff", error=why))
    assert [(a.kind, a.message) for a in alerts] == [(ENDED, f"run killed: {why}")]
