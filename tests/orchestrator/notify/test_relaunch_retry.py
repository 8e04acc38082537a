"""How a headless watch goes on after a relaunch that did not start (notify/relaunch.Relauncher): tried again with
a growing pause while the loss is unclaimed, never again after a refusal, and a quiet note, no error, where another
watcher healed the loss first; and what the relaunch says it resumes from. The client's answers are the ones the
agent gives (tests/dflash_agent/test_restart.py, tests/on_lab/test_lab_heal.py run them for real); the source
stands in for the live one, which needs hosts."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.alertkinds import ERROR, INFO, WARNING
from orchestrator.errors import TransportError
from orchestrator.notify.relaunch import RELAUNCH_NOTE, Relauncher
from orchestrator.runs.client import RelaunchFailed, Relaunched
from orchestrator.watch.model import AlertFeed
from orchestrator.watch.trackers import RunTracker

LOST = {"run_id": "r1", "target": "pve1/200", "name": "big", "state": "lost", "restart_policy": "on-failure:2",
        "max_attempts": 3, "attempts": [{"attempt": 1}], "grace_s": 7}


class Source:
    """The live source's part a Relauncher uses: the inventory, the client, the watch's own alerts."""

    def __init__(self, answers: list) -> None:
        self.answers, self.calls, self.notes = list(answers), [], []
        self.inventory, self.client = self, self

    def target(self, name: str) -> str:
        return name

    def relaunch(self, target: str, run_id: str, *, name: str, grace: float | None) -> Relaunched:
        self.calls.append((target, run_id, grace))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def note(self, alert) -> None:
        self.notes.append(alert)


def started(run_id: str = "r2", **extra) -> Relaunched:
    return Relaunched(RunRecord(run_id=run_id, state="running"), **{"resumes_from": None, "resumes": False, **extra})


def feed(record: dict = LOST) -> AlertFeed:
    status = RunTracker(record["target"], RunRecord.from_dict(record), history=1, tail=1).status()
    return AlertFeed(cursor=0, version=0, runs={status.run_id: status})


def watcher(answers: list) -> tuple[Relauncher, Source, list, list]:
    source, said, now = Source(answers), [], [0.0]
    relauncher = Relauncher(source, said.append, clock=lambda: now[0])
    return relauncher, source, said, now


def test_a_relaunch_that_did_not_start_is_tried_again_later_and_later_until_it_does() -> None:
    failure = TransportError("pve1/200: the agent gave no answer (exit 1)")
    survivor = RelaunchFailed("pve1/200: r1 not relaunched yet: process(es) 9 of it survived SIGKILL",
                              code="survivors_left")
    relauncher, source, said, now = watcher([failure, survivor, started()])
    relauncher(feed())
    relauncher(feed())  # at once: not yet
    assert len(source.calls) == 1 and said[0]["type"] == "relaunch_failed" and said[0]["retry_in_s"] == 5
    now[0] = 5.0
    relauncher(feed())
    assert len(source.calls) == 2 and said[1]["retry_in_s"] == 10 and "(try 2)" in said[1]["message"]
    now[0] = 14.0
    relauncher(feed())
    assert len(source.calls) == 2  # 10 s after the second failure, not 5
    now[0] = 15.0
    relauncher(feed())
    relauncher(feed())
    assert source.calls == [("pve1/200", "r1", 7.0)] * 3  # the run's grace for what still runs of it
    assert said[2]["type"] == "relaunched" and said[2]["new_run_id"] == "r2" and "(try 3)" in said[2]["message"]
    assert [n.severity for n in source.notes] == [ERROR, ERROR, WARNING]
    assert [relauncher.retry_in(n) for n in (1, 2, 3, 7, 8, 60)] == [5, 10, 20, 300, 300, 300]


def test_a_loss_another_watcher_healed_is_a_quiet_note_and_a_refusal_is_not_tried_again() -> None:
    healed = RelaunchFailed("pve1/200: r1 not relaunched: already relaunched as r9", code="already_relaunched")
    relauncher, source, said, now = watcher([healed])
    relauncher(feed())
    now[0] = 1000.0
    relauncher(feed())
    assert len(source.calls) == 1
    [note] = source.notes
    assert (said[0]["type"], note.kind, note.severity) == (RELAUNCH_NOTE, RELAUNCH_NOTE, INFO)
    assert "already relaunched as r9" in note.message
    refused = RelaunchFailed("pve1/200: r1 not relaunched: its restarts are used up", code="not_relaunched")
    relauncher, source, said, now = watcher([refused])
    relauncher(feed())
    now[0] = 1000.0
    relauncher(feed())
    assert len(source.calls) == 1 and source.notes[0].severity == ERROR and "trying again" not in said[0]["message"]


def test_the_relaunch_says_a_checkpoint_is_resumed_only_where_the_trainer_has_one() -> None:
    def message(relaunched: Relaunched) -> str:
        relauncher, source, said, _ = watcher([relaunched])
        relauncher(feed())
        return said[0]["message"]
    assert message(started(resumes=True, resumes_from="step_400")).endswith(
        "resuming from its newest checkpoint (step_400)")
    assert message(started(resumes=True)).endswith("starting over: no checkpoint to resume from yet")
    plain = message(started(survivors_ended=(41, 42)))
    assert "running its command again as it was" in plain and "resum" not in plain
    assert "process(es) 41, 42 of it still ran: ended first" in plain
