"""One SSH channel's input and output: stdin sent within the timeout, stdout and stderr read until end of file."""
from __future__ import annotations

import select
import socket
import time

import paramiko

from ..errors import CommandTimeout
from .base import shown_argv


def send_input(chan: paramiko.Channel, data: bytes, timeout: float | None, label: str,
                argv: tuple[str, ...]) -> None:
    """Send a command's stdin; one that stops reading (a hung `pct exec`) is a timeout, not a hang."""
    chan.settimeout(timeout)
    try:
        chan.sendall(data)
    except socket.timeout:
        raise CommandTimeout(f"{label}: unresponsive: {shown_argv(argv)} did not take its input in "
                             f"{timeout:g}s") from None
    finally:
        chan.settimeout(None)


def drain(chan: paramiko.Channel, timeout: float | None, label: str, argv: tuple[str, ...],
           out: bytearray, err: bytearray) -> int:
    """Read stdout and stderr (into `out` and `err`) until the remote side closes them; the exit status.

    Like OpenSSH, this waits for end-of-file, not just for the command's exit: a background child still holding
    the output keeps the channel open (the timeout then reports it instead of hanging forever).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed:
            raise EOFError("channel closed before end of output")
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise CommandTimeout(f"{label}: unresponsive: {shown_argv(argv)} did not finish in {timeout:g}s")
        select.select([chan], [], [], min(remaining, 1.0) if remaining is not None else 1.0)
    remaining = None if deadline is None else max(deadline - time.monotonic(), 0.01)
    if not chan.status_event.wait(remaining):
        raise CommandTimeout(f"{label}: unresponsive: {shown_argv(argv)} closed its output but did not exit "
                             f"in {timeout:g}s")
    return chan.recv_exit_status()
