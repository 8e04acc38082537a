"""A slow fleet is waited for, a silent target is not (issue 47): the first-word limit and `watch --once`'s wait
count from the fleet's last progress, not from the start, and stream starts take turns."""
from __future__ import annotations

import threading
import time

from orchestrator.transports import handshakes
from orchestrator.watch.source import LiveSource
from orchestrator.watch.stream import FIRST_WORD_S, HostActivity, StreamOptions


def test_a_first_word_is_overdue_only_after_the_fleet_went_quiet() -> None:
    activity = HostActivity()
    assert not activity.first_word_overdue(started=0.0, now=FIRST_WORD_S)
    assert activity.first_word_overdue(started=0.0, now=FIRST_WORD_S + 1)  # nobody said a word: overdue
    activity.heard("pve7", 40.0, first=True)  # another stream's agent came up at 40 s: the fleet is moving
    assert not activity.first_word_overdue(started=0.0, now=FIRST_WORD_S + 30)
    assert activity.first_word_overdue(started=0.0, now=40.0 + FIRST_WORD_S + 1)
    activity.heard("pve7", 80.0)  # a later message of a stream already up is no first word
    assert activity.first_word_overdue(started=0.0, now=40.0 + FIRST_WORD_S + 1)


class _Target:
    def __init__(self, name: str) -> None:
        self.name = name
        self.answered = False


def _source_of(states: list[_Target]) -> LiveSource:
    """A LiveSource with these target states and no streams (the wait reads nothing else)."""
    source = LiveSource.__new__(LiveSource)
    source._lock = threading.Condition(threading.RLock())
    source._targets = {state.name: state for state in states}
    return source


def test_watch_once_waits_while_targets_keep_answering() -> None:
    states = [_Target(f"t{i}") for i in range(6)]
    source = _source_of(states)

    def answer_one_by_one() -> None:  # one every 0.3 s: 1.8 s in all, each gap well inside the 1 s quiet limit
        for state in states:
            time.sleep(0.3)
            with source._lock:
                state.answered = True
                source._lock.notify_all()

    thread = threading.Thread(target=answer_one_by_one)
    started = time.monotonic()
    thread.start()
    assert source.wait_while_answering(1.0, cap_s=10.0)  # a total bound of 1 s would have given up
    assert time.monotonic() - started > 1.5
    thread.join()


def test_watch_once_gives_up_on_a_silent_target_after_the_quiet_time_and_at_the_cap() -> None:
    quiet = [_Target("up"), _Target("silent")]
    quiet[0].answered = True
    started = time.monotonic()
    assert not _source_of(quiet).wait_while_answering(0.5, cap_s=10.0)
    assert 0.4 < time.monotonic() - started < 3.0
    started = time.monotonic()
    assert not _source_of([_Target("silent")]).wait_while_answering(10.0, cap_s=0.5)
    assert time.monotonic() - started < 3.0


def test_stream_starts_and_ssh_handshakes_take_turns() -> None:
    options = StreamOptions()
    held = [options.starting.acquire(blocking=False) for _ in range(100)]
    assert 1 < sum(held) < 100  # bounded, and shared by every stream of one source
    turns = []
    for _ in range(100):
        turn = handshakes._turns.acquire(blocking=False)
        turns.append(turn)
    assert sum(turns) == handshakes.HANDSHAKES_AT_ONCE
    for _ in range(sum(turns)):
        handshakes._turns.release()
