"""Polling for a condition in tests that watch real processes and files."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    """predicate()'s first truthy value, or its last value once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
