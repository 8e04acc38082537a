"""The suite's turn-taking for tests that load the whole machine (tests/conftest.py `_turn`), with real flock
locks: a loading test waits for the tests already running, and no new test starts while it waits or runs."""
from __future__ import annotations

import fcntl
import os
import threading
import time

from tests.conftest import _turn
from tests.polling import wait_for


def gate_taken(shared) -> bool:
    fd = os.open(shared / "machine-turn.gate", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_loading_test_waits_for_the_running_ones_and_holds_back_new_ones(tmp_path):
    entered, running, finish_first = [], threading.Event(), threading.Event()
    trying_second = threading.Event()

    def first_test():
        with _turn(tmp_path, alone=False):
            entered.append("first")
            running.set()
            finish_first.wait(10)

    def loading_test():
        with _turn(tmp_path, alone=True):
            entered.append("loading")

    def second_test():
        trying_second.set()
        with _turn(tmp_path, alone=False):
            entered.append("second")

    threads = [threading.Thread(target=first_test)]
    threads[0].start()
    assert running.wait(10)
    threads.append(threading.Thread(target=loading_test))
    threads[-1].start()
    wait_for(lambda: gate_taken(tmp_path), timeout=10, what="the loading test to take the gate")
    threads.append(threading.Thread(target=second_test))
    threads[-1].start()
    assert trying_second.wait(10)
    time.sleep(0.3)   # room for the second test to get in, were the gate not there
    assert entered == ["first"]          # the loading test waits for the first; the second waits behind it
    finish_first.set()
    for thread in threads:
        thread.join(10)
    assert entered == ["first", "loading", "second"]
