"""How many SSH connections this process sets up at once.

A connection's set-up (TCP, banner, key exchange, authentication) is a paramiko thread's work under the GIL on
this side and a fork of sshd's on the other. A fleet's worth of them at once on a small controller starve each
other until some pass their connect timeout, and a slow fleet would be called unreachable for what is the
controller's own crowding. So set-ups take turns, a few at a time, and the connect timeout counts from the
moment a set-up's turn came: waiting for a turn never makes a host unreachable; only the host's own silence does.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

HANDSHAKES_AT_ONCE = 8  # enough to keep a 2-core controller busy; more only lengthens each one

_turns = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)


@contextmanager
def handshake_turn() -> Iterator[None]:
    """Hold one of the process's set-up turns (blocks until one is free)."""
    with _turns:
        yield
