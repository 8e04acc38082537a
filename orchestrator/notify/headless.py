"""`dflashctl watch --headless`: the dashboard's live source and alert rules with no screen.

Every new alert is one JSON line on stdout (and every host that drops or comes back, so a log of the watcher
says why it went quiet); notifications go out as the dashboard would send them. It runs until SIGTERM or
SIGINT, then sends what is still queued (a few seconds at most), and prints one `unsent` line per destination
that was left with notifications it could not send. A run lost with its container that has a restart policy is
relaunched, once per loss (relaunch.py), and a `relaunched` line says so.
"""
from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TextIO

from ..watch.model import AlertFeed, HostView
from ..watch.source import LiveSource

from dflash_records.protocol import iso_utc

from .destinations import Destination
from .pump import AlertPump
from .relaunch import Relauncher
from .sender import Unsent, by_destination

LINE_VERSION = 1


class JsonLines:
    """Prints a feed's news as JSON lines: each alert with its run's name and last step line, host changes."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._hosts: dict[str, tuple[bool, str | None]] = {}

    def __call__(self, feed: AlertFeed, *, hosts: bool = True) -> None:
        for alert, old in feed.flagged():
            run = feed.runs.get(alert.run_id or "")
            self.print_line({"type": "alert", **asdict(alert), "name": run.name if run else None,
                         "state": run.state if run else None, "last_step_line": run.last_step_line if run else None,
                         "backlog": old})
        for host in feed.hosts if hosts else ():
            self._host(host)

    def _host(self, host: HostView) -> None:
        now = (host.connected, host.error)
        before = self._hosts.get(host.name)
        self._hosts[host.name] = now
        if before == now or (before is None and not host.connected and not host.error):
            return  # unchanged, or not connected *yet*: only an answer or a failure is news
        self.print_line({"type": "host", "time": iso_utc(timespec="seconds"), "host": host.name,
                         "connected": host.connected, "error": host.error})

    def unsent(self, unsent: Sequence[Unsent]) -> None:
        """One line per destination: how many notifications, of which kinds and runs, and why not."""
        for destination, left in by_destination(unsent).items():
            self.print_line({"type": "unsent", "time": iso_utc(timespec="seconds"), "destination": destination.shown,
                         "count": len(left), "kinds": [u.message.kind for u in left],
                         "run_ids": [u.message.run_id for u in left],
                         "reasons": list(dict.fromkeys(u.reason for u in left))})

    def print_line(self, record: dict) -> None:
        self.out.write(json.dumps({"version": LINE_VERSION, **record}, default=str) + "\n")
        self.out.flush()


def run_headless(source: LiveSource, destinations: Sequence[Destination], *,
                 out: TextIO | None = None) -> list[Unsent]:
    """Watch until SIGTERM/SIGINT; the notifications the stop could not send (printed too)."""
    lines = JsonLines(out or sys.stdout)
    relauncher = Relauncher(source, lines.print_line)

    def on_feed(feed: AlertFeed) -> None:
        # once stopping, a host that drops is the stop's doing (Ctrl-C reaches a local watch agent too): no news
        lines(feed, hosts=not pump.stopping)
        relauncher(feed)
    pump = AlertPump(source, destinations, on_feed=on_feed)
    previous = {sig: signal.signal(sig, lambda _signum, _frame: pump.request_stop())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        pump.run()
    finally:
        unsent = pump.stop()
        source.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    lines.unsent(unsent)
    return unsent
