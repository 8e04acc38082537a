"""Reads the live source's alert feed and hands it on: to the notification policy and its sender, and to
whoever else wants each new alert (the headless watcher prints them). Runs on its own thread beside the
dashboard, or on the main thread of `watch --headless`."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from dflash_records.protocol import iso_utc

from ..alertkinds import WARNING
from ..watch.model import AlertFeed, AlertView
from ..watch.source import LiveSource
from .destinations import Destination
from .policy import NotifyPolicy, Outgoing
from .sender import Sender, Unsent

NOTIFY_FAILED = "notify_failed"
MIN_GAP_S = 0.2  # a busy source changes many times a second; the feed is read at most this often
WAIT_S = 1.0
FLUSH_S = 5.0  # how long a stop lets every destination, at once, send what it still holds


class AlertPump:
    def __init__(self, source: LiveSource, destinations: Sequence[Destination], *,
                 on_feed: Callable[[AlertFeed], None] | None = None) -> None:
        self.source = source
        self.policy = NotifyPolicy(destinations)
        self.sender = Sender(destinations, self._failed) if destinations else None
        self._on_feed = on_feed
        self._cursor, self._version = 0, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Until `stop()`: read what is new, notify, hand it on."""
        while not self._stop.is_set():
            started = time.monotonic()
            self.step(WAIT_S)
            self._stop.wait(max(0.0, MIN_GAP_S - (time.monotonic() - started)))

    def step(self, timeout: float = 0.0) -> AlertFeed:
        feed = self.source.alert_feed(self._cursor, after_version=self._version, timeout=timeout)
        self._cursor, self._version = feed.cursor, feed.version
        if self.sender is not None:
            self.sender.submit(self.policy.observe(feed, time.time()))
        if self._on_feed is not None:
            self._on_feed(feed)
        return feed

    def start(self) -> "AlertPump":
        self._thread = threading.Thread(target=self.run, name="alert-pump", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Have `run()` return after the read under way (safe in a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, *, flush_s: float = FLUSH_S) -> list[Unsent]:
        """Stop reading; give what is queued up to `flush_s` seconds to go out; what did not."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(WAIT_S + 1.0)
        return self.sender.close(flush_s) if self.sender is not None else []

    def _failed(self, message: Outgoing, error: str) -> None:
        self.source.note(AlertView(time=iso_utc(timespec="seconds"), run_id=message.run_id, target=message.target,
                                   kind=NOTIFY_FAILED, severity=WARNING,
                                   message=f"{message.kind} notification to {message.destination.shown} not sent: "
                                           f"{error}"))
