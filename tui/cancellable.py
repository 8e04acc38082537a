"""Pauses inside worker threads that end as soon as their worker is cancelled (the app or screen closed)."""
from __future__ import annotations

import time

from textual.worker import Worker

NAP_S = 0.05


def sleep_unless_cancelled(worker: Worker, seconds: float) -> None:
    """Sleep up to `seconds` in short naps; return early once `worker` is cancelled."""
    deadline = time.monotonic() + seconds
    while not worker.is_cancelled and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, NAP_S))
