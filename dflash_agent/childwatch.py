"""What a process that adopts orphans needs: the subreaper flag, reaping, and waking up on signals."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """Make orphaned descendants re-parent to us instead of to PID 1 (which may never reap them)."""
    # the process's own symbols first: find_library runs `ldconfig -p` (milliseconds at every keeper and
    # supervisor start), so it is asked only when they do not hold prctl
    for find in (lambda: None, lambda: ctypes.util.find_library("c")):
        try:
            libc = ctypes.CDLL(find(), use_errno=True)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                return True
        except (OSError, AttributeError):
            continue
    print("warning: prctl(PR_SET_CHILD_SUBREAPER) failed: orphans will go to PID 1", file=sys.stderr)
    return False


def reap_children() -> list:
    """Collect every child that has ended: [(pid, wait status)]. Never blocks."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def decode_status(status: int) -> tuple:
    """(exit_code, signal) from a wait status; exactly one of them is set."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "SIG{}".format(signum)


class Wakeup:
    """Sleeps until a handled signal arrives or a timeout passes, without the races of signal.pause()."""

    def __init__(self, signals: dict) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        for signum, handler in signals.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._write)

    def wait(self, timeout: float) -> None:
        try:
            select.select([self._read], [], [], timeout)
        except InterruptedError:
            pass
        try:
            while os.read(self._read, 4096):
                pass
        except OSError:
            pass


def ignore_signal(signum, frame) -> None:
    """A handler that does nothing: installing it makes the signal wake a Wakeup."""
