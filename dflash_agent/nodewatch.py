"""`node-watch --stall S -- CMD`: runs one node of a multi-node job (torchrun) and makes sure it ends.

torchrun's agent talks to the rendezvous store on the job's first node; when that node is cut off, the agent
can block in a store call long after its workers failed on the collective timeout, and the node would never
end. This watch starts CMD, and once CMD has had worker processes and then none for S seconds while CMD is
still alive, it ends CMD (TERM, then KILL) and exits 1 with the reason in the log. Otherwise it passes
signals on and mirrors CMD's end: the same exit code, or death by the same signal.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from . import procfs

POLL_S = 0.5
TERM_GRACE_S = 5.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def live_children(pid: int) -> list:
    table = procfs.snapshot()
    return [p for p in procfs.descendants(table, pid) if not table[p].is_zombie]


def say(message: str) -> None:
    sys.stderr.write("dflash node-watch: {}\n".format(message))
    sys.stderr.flush()


def end(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def watch(proc: subprocess.Popen, stall: float) -> int | None:
    """Wait for CMD; None when it ended by itself, 1 when it had to be ended for stalling."""
    had_workers, idle_since = False, None
    while proc.poll() is None:
        if live_children(proc.pid):
            had_workers, idle_since = True, None
        elif had_workers:
            idle_since = idle_since if idle_since is not None else time.monotonic()
            if time.monotonic() - idle_since >= stall:
                say("{} is still running {:g} s after its last worker ended (the rendezvous store on the first "
                    "node is unreachable?); ending it".format(os.path.basename(proc.args[0]), stall))
                end(proc)
                return 1
        time.sleep(POLL_S)
    return None


def mirror(returncode: int) -> int:
    """Exit as CMD did: its code, or by its signal (so the supervisor records the signal)."""
    if returncode >= 0:
        return returncode
    signum = -returncode
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum


def node_watch(command: list, *, stall: float) -> int:
    proc = subprocess.Popen(command)
    for signum in FORWARDED:
        signal.signal(signum, lambda sig, _frame: proc.poll() is None and proc.send_signal(sig))
    forced = watch(proc, stall)
    return forced if forced is not None else mirror(proc.returncode)
