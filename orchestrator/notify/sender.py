"""Sends notifications with one thread and one queue per destination, so a slow or dead service holds up neither
the watch nor any other destination.

`submit` only queues; each destination's thread sends its messages one at a time through its apprise plugin,
whose own connect and read timeouts bound every attempt (the URL's `cto=` and `rto=`, apprise's 4 s each unless
set). What fails is handed to `on_failure` with apprise's own reason and never raised; a queue that overflows (a
service that stopped answering while alerts keep coming) drops the newest messages and says so. `close` lets
every destination send what it holds, all at once, for one overall time, and returns what did not go out; a
thread still waiting on a service then is left to end with the process, never waited for.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..alertkinds import ERROR, WARNING
from .destinations import Destination, load_apprise
from .kinds import RECOVERED
from .policy import Outgoing

MAX_QUEUED = 1000
APPRISE_LOGGER = "apprise"  # where apprise logs why a send failed
OnFailure = Callable[[Outgoing, str], None]


@dataclass(frozen=True)
class Unsent:
    """A message that a close could not deliver, and why."""

    message: Outgoing
    reason: str


class Sender:
    """Every destination's courier, each with its thread and its queue."""

    def __init__(self, destinations: Sequence[Destination], on_failure: OnFailure) -> None:
        apprise = load_apprise()
        self._couriers = {destination: _Courier(destination, apprise, on_failure) for destination in destinations}

    def submit(self, messages: Iterable[Outgoing]) -> None:
        for message in messages:
            self._couriers[message.destination].submit(message)

    def close(self, timeout: float) -> list[Unsent]:
        """Send what is queued, every destination at once, for at most `timeout` seconds in all; what did not go
        out (failed meanwhile, or still queued or unanswered when the time ran out). Empty: everything went."""
        deadline = time.monotonic() + timeout
        for courier in self._couriers.values():
            courier.finish()
        late = f"not sent within the stop's {timeout:g} s"
        return [unsent for courier in self._couriers.values() for unsent in courier.wait(deadline, late)]


def by_destination(unsent: Iterable[Unsent]) -> dict[Destination, list[Unsent]]:
    """What was not sent, grouped by where it was going (in the order of the messages)."""
    grouped: dict[Destination, list[Unsent]] = {}
    for item in unsent:
        grouped.setdefault(item.message.destination, []).append(item)
    return grouped


class _Courier:
    """One destination's thread and queue."""

    def __init__(self, destination: Destination, apprise: Any, on_failure: OnFailure) -> None:
        self._apprise, self._on_failure = apprise, on_failure
        self._queue: deque[Outgoing] = deque()
        self._in_flight: Outgoing | None = None
        self._changed = threading.Condition()
        self._finishing = False  # take nothing more: send what is held, then end
        self._abandoned = False  # the close's time ran out: whatever happens next no longer counts
        self._failed_at_close: list[Unsent] = []  # failures once finishing: the close reports them, not on_failure
        self._thread = threading.Thread(target=self._run, name=f"notify-{destination.shown}", daemon=True)
        self._reasons = _Reasons(self._thread)
        logging.getLogger(APPRISE_LOGGER).addHandler(self._reasons)
        self._thread.start()

    def submit(self, message: Outgoing) -> None:
        with self._changed:
            taken = len(self._queue) < MAX_QUEUED
            if taken:
                self._queue.append(message)
                self._changed.notify()
        if not taken:
            self._on_failure(message, f"{MAX_QUEUED} notifications already wait to be sent; this one is dropped")

    def finish(self) -> None:
        with self._changed:
            self._finishing = True
            self._changed.notify()

    def wait(self, deadline: float, late: str) -> list[Unsent]:
        """After `finish()`: wait for the queue to empty until `deadline`; what did not go out."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._changed:
            self._abandoned = True
            left = ([self._in_flight] if self._in_flight is not None else []) + list(self._queue)
            self._queue.clear()
            return self._failed_at_close + [Unsent(message, late) for message in left]

    def _run(self) -> None:
        try:
            self._deliver()
        finally:
            logging.getLogger(APPRISE_LOGGER).removeHandler(self._reasons)

    def _deliver(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._finishing:
                    self._changed.wait()
                if not self._queue or self._abandoned:
                    return
                message = self._in_flight = self._queue.popleft()
            error = self._send(message)
            with self._changed:
                if self._abandoned:
                    return
                self._in_flight = None
                closing = self._finishing
                if error is not None and closing:
                    self._failed_at_close.append(Unsent(message, error))
            if error is not None and not closing:
                self._on_failure(message, error)

    def _send(self, message: Outgoing) -> str | None:
        """None once sent, else why not (apprise logs its reasons rather than raising them)."""
        notify_type = {ERROR: "FAILURE", WARNING: "WARNING", RECOVERED: "SUCCESS"}.get(message.severity, "INFO")
        self._reasons.lines.clear()
        try:
            sent = message.destination.plugin.notify(body=message.body, title=message.title,
                                                     notify_type=getattr(self._apprise.NotifyType, notify_type))
        except Exception as exc:  # a plugin's own bug must not end the sender: report it like a refusal
            return f"{type(exc).__name__}: {exc}"
        if sent:
            return None
        return self._reasons.lines[-1] if self._reasons.lines else "the service refused it"


class _Reasons(logging.Handler):
    """The warnings apprise logs on one courier's thread: why its last send failed. (apprise's LogCapture takes
    every thread's lines, and restores the logger's level from under the others.)"""

    def __init__(self, thread: threading.Thread) -> None:
        super().__init__(logging.WARNING)
        self._thread = thread
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread.ident:
            self.lines.append(record.getMessage())
