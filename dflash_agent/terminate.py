"""Ending processes that are not our children: TERM, a grace period, then KILL, always identity-checked."""
from __future__ import annotations

import os
import signal
import time

from . import procfs

POLL_S = 0.05
KILL_WAIT_S = 3.0


def send(pid: int, start: int, sig: int) -> bool:
    """Signal `pid` only if it is still the process that started at `start` (pids get reused), and lives in
    our PID namespace: from a host, a container's processes are never ours to end."""
    if start is None or not procfs.is_alive(pid, start) or not procfs.in_our_pid_namespace(pid):
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_gone(targets: list, timeout: float, *, tick=None) -> list:
    """Wait until none of `targets` runs (zombies count as gone); return those still running."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        alive = [(pid, start) for pid, start in targets if procfs.is_alive(pid, start)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def end_processes(targets: list, *, grace: float, tick=None) -> tuple:
    """TERM every (pid, start) in `targets`, KILL what is left after `grace`.

    Returns (pids that survived even SIGKILL, whether SIGKILL was needed).
    """
    for pid, start in targets:
        send(pid, start, signal.SIGTERM)
    alive = wait_gone(targets, grace, tick=tick)
    for pid, start in alive:
        send(pid, start, signal.SIGKILL)
    escalated = bool(alive)
    alive = wait_gone(alive, KILL_WAIT_S, tick=tick)
    return [pid for pid, _ in alive], escalated

