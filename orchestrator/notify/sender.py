"""Sends notifications on a thread of its own, so a slow or dead service never holds up the watch.

`submit` only queues; the thread sends one message at a time through the destination's apprise plugin (which
brings its own connect and read timeouts). What fails is handed to `on_failure` with apprise's own reason and
never raised; a queue that overflows (a service that stopped answering while alerts keep coming) drops the
newest messages and says so.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from ..watch.alerts import ERROR, WARNING
from .destinations import load_apprise
from .kinds import RECOVERED
from .policy import Outgoing

MAX_QUEUED = 1000
OnFailure = Callable[[Outgoing, str], None]
_STOP = object()


class Sender:
    def __init__(self, on_failure: OnFailure, *, on_sent: Callable[[Outgoing], None] | None = None) -> None:
        self._apprise = load_apprise()
        self._on_failure, self._on_sent = on_failure, on_sent
        self._queue: queue.Queue[object] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="notify-sender", daemon=True)
        self._thread.start()

    def submit(self, messages: Iterable[Outgoing]) -> None:
        for message in messages:
            try:
                self._queue.put_nowait(message)
            except queue.Full:
                self._on_failure(message, f"{MAX_QUEUED} notifications already wait to be sent; this one is dropped")

    def close(self, timeout: float) -> bool:
        """Send what is queued, for at most `timeout` seconds; True when everything went out."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            message = self._queue.get()
            if not isinstance(message, Outgoing):  # the stop mark
                return
            error = self._send(message)
            if error is not None:
                self._on_failure(message, error)
            elif self._on_sent is not None:
                self._on_sent(message)

    def _send(self, message: Outgoing) -> str | None:
        """None once sent, else why not (apprise logs its reasons rather than raising them)."""
        notify_type = {ERROR: "FAILURE", WARNING: "WARNING", RECOVERED: "SUCCESS"}.get(message.severity, "INFO")
        try:
            with self._apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as log:
                sent = message.destination.plugin.notify(
                    body=message.body, title=message.title,
                    notify_type=getattr(self._apprise.NotifyType, notify_type))
            reason = log.getvalue().strip().splitlines()
        except Exception as exc:  # a plugin's own bug must not end the sender: report it like a refusal
            return f"{type(exc).__name__}: {exc}"
        if sent:
            return None
        return reason[-1] if reason else "the service refused it"
