"""`packages`: install a trainer package sent on stdin, and remove the versions nothing uses any more.

Packages are content-addressed directories `{workdir}/.dflash/pkg/<digest>/`, put on a trainer run's PYTHONPATH.
One arrives as a gzipped tar of known size and sha256, read whole before anything is written (a dead link must
not hold the receiver for ever: it gives up after `stall` seconds without a byte), and extracted by this
process itself: a `tar` child would outlive a receiver killed mid-upload and end as a zombie of the
container's PID 1, which may never reap. It is extracted into `<digest>.tmp.<pid>` and renamed into place; a
receiver that fails removes its temp dir, and one killed outright leaves it to the next prune, which removes
a temp dir once its pid is gone.

A version is in use while a live run lists it on its pythonpath (run.json), or while it was installed or asked
for recently (LEASE_S: a launch deploys, checks the config, then starts the run, and a concurrent launch of
another dflashctl version must not lose its package in between). Nothing else under pkg/ is touched.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import select
import shutil
import sys
import tarfile
import time

from dflash_records.plans import PackagesAnswer
from dflash_records.protocol import KILLED, NEEDS_DEPLOY, SUCCEEDED, ascii_decimal
from dflash_records.restart import ON_FAILURE

from . import procfs
from .errors import OperationFailed
from .rundir import RunPaths, list_run_ids
from .runstate import is_live, read_run, read_state

LEASE_S = 3600.0
VERSION = re.compile(r"[0-9a-f]{16}")
TEMP = re.compile(r"([0-9a-f]{16})\.tmp(?:\.([0-9]+))?")  # `.tmp` alone: what versions before pids in names left


def packages(pkg_dir: str, runs_dir: str, *, size: int | None, sha256: str | None,
             stall: float) -> PackagesAnswer:
    """Install `pkg_dir` from stdin when `size` is given (unless it is there already), keep it leased, and prune
    the other versions of its directory."""
    pkg_dir = os.path.abspath(pkg_dir)
    installed = False
    if size is not None:
        data = receive(0, size, sha256, stall=stall)
        installed = install(pkg_dir, data)
    return PackagesAnswer(ok=True, installed=installed, removed=tuple(_lease(pkg_dir, runs_dir)))


def lease(pkg_dir: str, runs_dir: str | None) -> dict | None:
    """A launch's or a check's `--lease-pkg`: None once the trainer package is leased (and, with the runs
    directory, the versions beside it that nothing uses pruned) in the same command, so that a trainer launch
    needs no `packages` of its own where its package already is; where it is not, the answer that says so (the
    command's stdin taken, so that the sender is not refused) and nothing is done."""
    pkg_dir = os.path.abspath(pkg_dir)
    if not os.path.isdir(os.path.join(pkg_dir, "trainer")):
        sys.stdin.buffer.read()
        return {"ok": False, "code": NEEDS_DEPLOY, "pkg": "absent"}
    removed = _lease(pkg_dir, runs_dir)
    if removed:
        print("removed trainer versions no run uses: {}".format(", ".join(removed)), file=sys.stderr)
    return None


def _lease(pkg_dir: str, runs_dir: str | None) -> list:
    try:
        os.utime(pkg_dir)  # the lease: asked for now, by a launch that is about to use it
    except OSError:
        pass  # not there (nothing was sent), or not ours to touch: keeping old versions longer is harmless
    return prune(os.path.dirname(pkg_dir), runs_dir) if runs_dir else []


def receive(fd: int, size: int, sha256: str | None, *, stall: float) -> bytes:
    """Exactly `size` bytes from `fd` whose sha256 is `sha256`; OperationFailed on a cut, a stall or a mismatch."""
    chunks, got = [], 0
    while True:
        ready, _, _ = select.select([fd], [], [], stall)
        if not ready:
            raise OperationFailed("upload stalled: no byte for {:g}s after {} of {} bytes".format(stall, got, size),
                                  code="upload_stalled")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
        if got > size:
            break
    data = b"".join(chunks)
    if len(data) != size:
        raise OperationFailed("upload cut short: {} of {} bytes arrived".format(len(data), size), code="upload_cut")
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise OperationFailed("upload damaged: its sha256 is not the one sent", code="upload_damaged")
    return data


def install(pkg_dir: str, data: bytes) -> bool:
    """Extract the tar.gz `data` as `pkg_dir`; False when a concurrent install of the same version got there first."""
    os.makedirs(os.path.dirname(pkg_dir), exist_ok=True)
    temp = "{}.tmp.{}".format(pkg_dir, os.getpid())
    try:
        os.mkdir(temp)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = _checked(archive)
            # the "data" filter where this Python has it (3.12, and security releases before): no links, no
            # modes beyond rw-r--r--; _checked already refuses anything but plain files and directories
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(temp, members=members, **kwargs)
        try:
            os.rename(temp, pkg_dir)
        except OSError:
            if os.path.isdir(os.path.join(pkg_dir, "trainer")):
                return False  # content-addressed: theirs is the same as ours
            raise
        return True
    except (OSError, tarfile.TarError) as exc:
        raise OperationFailed("cannot unpack into {}: {}".format(pkg_dir, exc), code="unpack_failed")
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _checked(archive: tarfile.TarFile) -> list:
    members = archive.getmembers()
    for member in members:
        parts = member.name.split("/")
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts:
            raise tarfile.TarError("refusing archive member {!r}".format(member.name))
    return members


def prune(pkg_root: str, runs_dir: str) -> list:
    """Remove the versions under `pkg_root` that no live run uses and nobody asked for within LEASE_S, and the
    temp dirs of receivers that are gone; the names removed."""
    try:
        names = sorted(os.listdir(pkg_root))
    except OSError:  # none yet, or unreadable: what is left there is no reason to fail a launch
        return []
    used = in_use(runs_dir)
    removed = []
    for name in names:
        path = os.path.join(pkg_root, name)
        if _removable(name, path, used):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(name)
    return removed


def _removable(name: str, path: str, used: set) -> bool:
    temp = TEMP.fullmatch(name)
    if temp and temp.group(2):  # a receiver's: removable once that receiver is gone
        return not procfs.is_alive(ascii_decimal(temp.group(2)), None)
    if not (temp or VERSION.fullmatch(name)) or path in used or not os.path.isdir(path):
        return False
    try:
        return time.time() - os.stat(path).st_mtime > LEASE_S
    except OSError:
        return False


def in_use(runs_dir: str) -> set:
    """Every directory on the pythonpath of a run of `runs_dir` that is live, or that a relaunch may start again
    (relaunch.py runs a lost run's command with its pythonpath)."""
    used = set()
    for run_id in list_run_ids(runs_dir):
        paths = RunPaths(runs_dir, run_id)
        run, state = read_run(paths), read_state(paths)
        if is_live(paths, run, state) or _may_relaunch(run, state):
            used.update(os.path.abspath(entry) for entry in run.get("pythonpath") or [])
    return used


def _may_relaunch(run: dict, state: dict) -> bool:
    """Under a restart policy (its own, or its job's), not relaunched yet, and neither killed nor succeeded: lost
    or failed, or not live any more with its end not yet written (a reboot took its supervisor)."""
    policy = (run.get("restart") or {}).get("policy")
    return (state.get("state") not in (KILLED, SUCCEEDED) and not state.get("relaunched_as")
            and (policy == ON_FAILURE or bool(run.get("worker_restarts"))))
