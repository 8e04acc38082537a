"""Where runs live: a small local cache of run ids and job ids -> the targets they are on, so that a command
naming a run by its full id (`dflashctl kill RUN`) asks only those targets instead of every target of the
inventory.

Run ids say nothing of their target (`<name>-<yymmdd>-<hhmmss>-<4 hex>`), so the cache is what knows: every
listing of runs (`ps`, a RUN lookup's sweep) and every `launch` write it. It is only ever a shortcut: an entry
whose target no longer has the run, is not in this inventory, or does not answer sends the lookup back to asking
every target. Kept in $XDG_STATE_HOME/dflashctl/whereabouts.json (~/.local/state/dflashctl/ by default), the
newest MAX_ENTRIES ids; written whole to a temporary file and renamed, so a reader never sees it half written.
Each update (read, add, write) holds a lock, between the threads of one command and between commands: without
it, the threads of `launch --each` that finished together each wrote back the file they had read, without the
others' runs (at 8 threads, most runs were lost), and a later `kill` of such a run asked every target.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

try:
    import fcntl
except ImportError:  # no flock here: the threads of one command still take turns
    fcntl = None  # type: ignore[assignment]

from dflash_records.run import RunRecord

MAX_ENTRIES = 5000
LOCK_WAIT_S = 5.0  # an update takes milliseconds; past this the holder is stuck and the update goes ahead
_UPDATES = threading.Lock()


def cache_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "dflashctl" / "whereabouts.json"


def remember(found: Iterable[tuple[str, RunRecord]]) -> None:
    """Record (target name, run record) pairs: the run's id, and its job's id with every target seen for it."""
    found = list(found)
    if not found:
        return
    with _update_lock():
        _add(found)


def _add(found: list[tuple[str, RunRecord]]) -> None:
    entries = _load()
    for target, run in found:
        run_id = run.run_id
        for group in (run.job_id, run.sweep_id):  # a job's or a sweep's runs: every target seen for it
            if isinstance(group, str) and group:
                targets = entries.pop(group, [])  # popped and put back: the newest stay when it is trimmed
                entries[group] = targets if target in targets else [*targets, target]
        if isinstance(run_id, str) and run_id:
            entries.pop(run_id, None)
            entries[run_id] = [target]  # a run lives on one target
    _save(dict(list(entries.items())[-MAX_ENTRIES:]))


def places(refs: Iterable[str]) -> dict[str, list[str]] | None:
    """The targets each of `refs` was last seen on, when every one of them is known; None otherwise."""
    entries = _load()
    found = {ref: entries.get(ref) for ref in refs}
    return None if not found or not all(found.values()) else found  # type: ignore[return-value]


@contextlib.contextmanager
def _update_lock() -> Iterator[None]:
    """This process's threads in turn, and other dflashctl commands in turn through an flock on a file beside
    the cache (never the cache itself, which each update replaces)."""
    with _UPDATES:
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.with_name(".whereabouts.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # a cache nobody can write: _save finds that out on its own
            yield
            return
        try:
            _flock(fd)
            yield
        finally:
            os.close(fd)  # releases the flock


def _flock(fd: int) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)
        except OSError:  # a file system without locks
            return


def _load() -> dict[str, list[str]]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: [t for t in v if isinstance(t, str)] for k, v in data.items() if isinstance(v, list)}


def _save(entries: dict[str, list[str]]) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".whereabouts-")
    except OSError:  # a cache nobody can write is a shortcut not taken
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
