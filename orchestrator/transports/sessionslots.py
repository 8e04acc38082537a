"""How many channels each connection to one host carries, and how many its server allows.

sshd serves at most MaxSessions channels on one connection (10 by default) and refuses the next one; the
connection itself stays up. The limit is learned from a refusal (the channels open on that connection at that
moment; fewer when the server has not yet freed one just closed), said the first time, and from then on a full
connection is skipped: the next channel goes over another connection to the same host.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

import paramiko

from ..errors import TransportError

log = logging.getLogger("dflashctl.ssh")


class SessionSlots:
    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self.limit: int | None = None  # channels per connection the server allows; None until it refused one
        self._channels: dict[paramiko.Transport, list[paramiko.Channel]] = {}
        # channels being opened on each connection right now: the server may count them already, so they count
        # against the room left and in what a refusal teaches (opened one by one, a refusal that came while 9
        # opens were under way would otherwise teach a limit of 1)
        self._opening: dict[paramiko.Transport, int] = {}
        self._lock = threading.Lock()

    def claim(self, transports: Iterable[paramiko.Transport]) -> paramiko.Transport | None:
        """The first of these connections with room for another channel, that room taken for a channel about to
        be opened (then `opened` or `refused`, or `abandoned` when it failed otherwise); None when all are full."""
        with self._lock:
            for transport in transports:
                if self.limit is None or self._open_on(transport) < self.limit:
                    self._opening[transport] = self._opening.get(transport, 0) + 1
                    return transport
        return None

    def opened(self, transport: paramiko.Transport, channel: paramiko.Channel) -> None:
        with self._lock:
            self._release(transport)
            self._channels.setdefault(transport, []).append(channel)

    def abandoned(self, transport: paramiko.Transport) -> None:
        with self._lock:
            self._release(transport)

    def _release(self, transport: paramiko.Transport) -> None:
        left = self._opening.get(transport, 0) - 1
        if left > 0:
            self._opening[transport] = left
        else:
            self._opening.pop(transport, None)

    def refused(self, transport: paramiko.Transport, exc: paramiko.SSHException) -> None:
        """Opening a channel on `transport` failed: when the server refused it, learn its limit (raises when it
        refuses even one); anything else (a dropped connection) is raised again."""
        if not refused(transport, exc):
            self.abandoned(transport)
            raise exc
        with self._lock:
            self._release(transport)
            open_now = self._open_on(transport)
            if open_now == 0:
                raise TransportError(f"{self.host_name}: the server refuses to open a session ({exc}); check "
                                     f"MaxSessions in its sshd_config (it must be 1 or more)")
            learned = open_now if self.limit is None else min(self.limit, open_now)
            first, self.limit = self.limit is None, learned
        if first:
            log.warning("%s refused a session with %d open on one connection (sshd's MaxSessions, 10 by default): "
                        "at most %d sessions per connection from now on, more go over another connection",
                        self.host_name, open_now, learned)

    def forget_all(self) -> None:
        """The connections closed: their channels are gone with them (the limit stays known)."""
        with self._lock:
            self._channels.clear()
            self._opening.clear()

    def _open_on(self, transport: paramiko.Transport) -> int:
        """The channels open on the connection and those being opened there now."""
        self._channels = {t: [c for c in chans if not c.closed] for t, chans in self._channels.items()
                          if t.is_active()}  # a dropped connection's channels are gone with it
        return len(self._channels.get(transport, [])) + self._opening.get(transport, 0)


def refused(transport: paramiko.Transport, exc: paramiko.SSHException) -> bool:
    """The server said no to a channel and the connection lives on. paramiko keeps a refusal's reason on the
    connection, not the channel: of two refused at once, one may raise the bare "Unable to open channel"."""
    return transport.is_active() and (isinstance(exc, paramiko.ChannelException)
                                      or str(exc) == "Unable to open channel.")
