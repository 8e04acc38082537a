"""The process group of each command we start over SSH, so that one we give up on can be ended on the host.

sshd starts every command in a session of its own (its shell leads the process group), and when the channel or
the whole connection goes it leaves a command without a terminal running: a `pct exec` that hangs (a frozen
container, a stuck lxc-attach) would stay on the host forever, one more after every command that timed out.
The SSH "signal" request would reach that group, but OpenSSH refuses it for root logins, which is how Proxmox
hosts are used. So each command line first says its shell's pid on stderr (taken out of what the caller sees),
and ending a command is `kill` on that process group from a second channel: TERM (which `pct exec` passes on
to what it runs in the container), then KILL if it is still there after a grace.

That second channel is a second round trip, which a controller that was killed, or one too loaded to get it
through in time, never makes. So a command with a timeout also carries its own bound on the host: its line runs
under coreutils' `timeout`, which ends the whole group (TERM, then KILL) a margin after the controller's timeout,
whatever becomes of the controller.
"""
from __future__ import annotations

import logging
import math
import re
import threading
import time

from ..errors import DflashError
from .base import Transport
from .timeouts import END_COMMAND_TIMEOUT_S, HOST_BOUND_GRACE_S, HOST_BOUND_MARGIN_S

log = logging.getLogger("dflashctl.ssh")

MARKER = b"::dflash-pgid "
_MARKER_LINE = re.compile(rb"(?m)^" + re.escape(MARKER) + rb"(\d+)\n")
END_GRACE_TICKS = 20  # tenths of a second between TERM and KILL
# "$@": the process groups (`kill -SIG -PGID`: dash's kill takes no `--`); TERM to each, then KILL to those that outlive the grace; done once all are gone
END_SCRIPT = ('for g do kill -TERM "-$g" 2>/dev/null; done; i=0; while :; do alive=; '
              'for g do kill -0 "-$g" 2>/dev/null && alive=1; done; [ -z "$alive" ] && exit 0; '
              f'if [ "$i" -ge {END_GRACE_TICKS} ]; then for g do kill -KILL "-$g" 2>/dev/null; done; exit 0; fi; '
              'sleep 0.1; i=$((i+1)); done')


def announced(line: bytes) -> bytes:
    """A command line that first writes its shell's pid (its process group: sshd made it a session leader)
    to stderr, then runs `line` in that shell."""
    return b'echo "' + MARKER + b'$$" >&2; ' + line


def bounded(line: bytes, timeout: float | None) -> bytes:
    """`line` (a command line that starts with a program, never a shell builtin) ended by the host itself a
    margin after `timeout`: the shell becomes `timeout`, which keeps the group sshd gave it (a session leader
    cannot make a group of its own) and signals that whole group, TERM, then KILL after the grace. Where the host
    has no `timeout`, the line runs as it is."""
    if timeout is None:
        return line
    bound = f"timeout -k {math.ceil(HOST_BOUND_GRACE_S)} {math.ceil(timeout + HOST_BOUND_MARGIN_S)}".encode()
    return b'b=; command -v timeout >/dev/null 2>&1 && b="' + bound + b'"; exec $b ' + line


def ended_by_bound(code: int, elapsed: float, timeout: float | None) -> bool:
    """A result read only after the controller's timeout had passed, that is the host's bound ending the
    command (timeout's 124, 128+KILL, or the shell itself killed: no exit status), not the command's own exit."""
    return timeout is not None and elapsed >= timeout and code in (124, 137, -1)


def split_marker(err: bytes) -> tuple[int | None, bytes]:
    """The process group a command announced, and its stderr without that line."""
    found = _MARKER_LINE.search(err)
    if found is None:
        return None, err
    return int(found.group(1)), err[:found.start()] + err[found.end():]


def end_argv(*pgids: int) -> list[str]:
    """The command that ends these process groups on the host: TERM, then KILL after the grace."""
    return ["sh", "-c", END_SCRIPT, "sh", *map(str, pgids)]


class RunningCommands:
    """The commands of one connection that may still run, each with what its stderr has said so far; what
    closing the connection must end first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stderr: dict[int, bytearray] = {}

    def add(self, key: int, err: bytearray) -> None:
        with self._lock:
            self._stderr[key] = err

    def done(self, key: int) -> None:
        with self._lock:
            self._stderr.pop(key, None)

    def groups(self) -> list[int]:
        """The process groups of the commands still running that have announced theirs."""
        with self._lock:
            found = [split_marker(bytes(err))[0] for err in self._stderr.values()]
        return [pgid for pgid in found if pgid is not None]


_ending = threading.local()   # set in a thread that is ending groups: its own command is never ended in turn
_pending: set[threading.Thread] = set()
_pending_lock = threading.Lock()


def end_later(transport: Transport, groups: list[int]) -> None:
    """End these process groups in a thread of its own (a dead link must not hold the caller up);
    wait_for_endings, before a connection closes, lets it finish."""
    if getattr(_ending, "active", False):
        return  # the ending command itself timed out, or its connection failed: logged, not chased forever
    thread = threading.Thread(target=_end_groups, args=(transport, groups), name="end remote", daemon=True)
    with _pending_lock:
        _pending.add(thread)
    thread.start()


def wait_for_endings(timeout: float = END_COMMAND_TIMEOUT_S) -> None:
    """Let the endings under way finish (at most `timeout`): the process may exit right after."""
    deadline = time.monotonic() + timeout
    with _pending_lock:
        threads = list(_pending)
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _end_groups(transport: Transport, groups: list[int]) -> None:
    _ending.active = True
    try:
        result = transport.run(end_argv(*groups), timeout=END_COMMAND_TIMEOUT_S)
    except DflashError as exc:
        log.warning("%s: could not end process group(s) %s: %s", transport.label, groups, exc)
        return
    finally:
        with _pending_lock:
            _pending.discard(threading.current_thread())
    if not result.ok:
        log.warning("%s: ending process group(s) %s: %s", transport.label, groups, result.describe())


def announced_group(chan, err: bytearray, wait_s: float = 1.0) -> int | None:
    """The process group the command announced on stderr; waits briefly for the line (a command that times
    out while its input is sent has not been read from yet)."""
    deadline = time.monotonic() + wait_s
    while True:
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        pgid = split_marker(bytes(err))[0]
        if pgid is not None or chan.closed or time.monotonic() > deadline:
            return pgid
        time.sleep(0.02)
