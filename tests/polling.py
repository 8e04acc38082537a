"""Polling for a condition in tests that watch real processes and files: the suite's one loop for it.

Its async twin for the dashboard's tests, which must await Pilot's pauses instead of sleeping, is
tests/tui/conftest.py (`wait_until`, `wait_for_screen`)."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.02, *,
             pause: Callable[[float], object] = time.sleep, what: str | Callable[[], object] | None = None):
    """predicate()'s first truthy value. Once `timeout` seconds have passed: its last value, or, with `what` (a
    text, or a function read then), an AssertionError saying what did not come. `pause(interval)` waits between
    tries: a source's `wait_for_change` wakes at the next change instead of sleeping the whole interval."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            break
        pause(interval)
    if not value and what is not None:
        raise AssertionError(f"not within {timeout} s: {what() if callable(what) else what}")
    return value
