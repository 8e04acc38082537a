"""What dflashctl itself runs short of while it reaches targets (file descriptors, threads, memory), said as such
for each target it hit: never as a dropped connection or an unreachable host, which it is not; and the open-file
limit raised at start.

Short of file descriptors, a connection's next channel or its first socket cannot be made, and paramiko and
fabric say so in many words ("Too many open files" on a config file, a select() that cannot make its pipe):
each is found by its errno wherever it sits in the exception's chain, and the connection it happened on is left
open (it is fine; closing it cut the other containers' commands on it short, which then read "the connection
dropped" with no word of file descriptors).
"""
from __future__ import annotations

import errno
import resource

from ..errors import OutOfResources

# select() takes no descriptor past FD_SETSIZE (1024), and the SSH channels are waited on with it: the soft limit
# is raised at most to this, never past what the user had
SELECT_FD_LIMIT = 1024


def raise_open_file_limit() -> None:
    """Raise the soft RLIMIT_NOFILE toward the hard one (at most SELECT_FD_LIMIT): a shell's `ulimit -Sn 64` is
    no reason to fail a fleet's targets while the hard limit allows more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = SELECT_FD_LIMIT if hard == resource.RLIM_INFINITY else min(hard, SELECT_FD_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass  # as it was: a shortage is then named for each target it hits


def _limit_text(limit: int, option: str) -> str:
    soft = resource.getrlimit(limit)[0]
    return f"ulimit -{option} {'unlimited' if soft == resource.RLIM_INFINITY else soft}"


def _short_of(code: int | None) -> str | None:
    if code == errno.EMFILE:
        return f"file descriptors ({_limit_text(resource.RLIMIT_NOFILE, 'n')})"
    if code == errno.ENFILE:
        return "file descriptors (the system's, fs.file-max)"
    if code == errno.ENOMEM:
        return "memory"
    if code == errno.EAGAIN:
        return f"processes or threads ({_limit_text(resource.RLIMIT_NPROC, 'u')})"
    return None


def resource_shortage(exc: BaseException) -> str | None:
    """What dflashctl ran short of, when `exc` or an error it came from says so (too many open files, no new
    thread): its cause and context, and the per-address errors of a connect that tried several."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and _short_of(current.errno) is not None:
            return _short_of(current.errno)
        if isinstance(current, RuntimeError) and "can't start new thread" in str(current):
            return _short_of(errno.EAGAIN)
        errors = getattr(current, "errors", None)  # paramiko's NoValidConnectionsError: one per address
        if isinstance(errors, dict):
            todo.extend(e for e in errors.values() if isinstance(e, BaseException))
        todo += [current.__cause__, current.__context__]
    return None


def out_of_resources(label: str, exc: BaseException, doing: str = "") -> OutOfResources | None:
    """The error for `label` when `exc` is a shortage of dflashctl's own (None otherwise): exit 3, naming what
    ran short and its limit, e.g. `pve1: dflashctl ran out of file descriptors (ulimit -n 64) while connecting`."""
    short = resource_shortage(exc)
    if short is None:
        return None
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return OutOfResources(f"{label}: dflashctl ran out of {short}{' ' + doing if doing else ''}: {reason}")
