"""Copy remote files to this machine through a transport's output stream: resumable, verified, bounded memory.

Each file arrives as `<name>.part` and is renamed to `<name>` only once its sha256 is the one the target gave:
a cut leaves the `.part`, and the next pull asks only for the bytes after it (`tail -c +N | head -c M` on the
target). What is already here is never trusted blindly: a complete file is skipped only when its size and
sha256 match, and a shorter copy of a growing file (a live run's log) is extended only when it is the start of
the remote one. Bytes go from the channel to the file in chunks: memory stays bounded whatever the file's size.
A file that cannot be written here (a full disk, a file size limit, a path that cannot be a directory) ends the
pull with its `.part` kept, as a cut does. Names are the workload's: a message shows them as terminal text.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_records.digest import sha256_of, sha256_state
from dflash_records.plans import PlanFile
from dflash_records.terminaltext import for_terminal

from ..errors import CommandTimeout, OperationFailed, TransportError, Unreachable
from ..transports.base import Transport

PART_SUFFIX = ".part"
# $1 path, $2 the first byte wanted (1-based), $3 how many bytes: exactly the bytes planned, even of a file
# that grew since (a live log), and nothing when it shrank (then the count falls short and says so)
RANGE_SCRIPT = 'tail -c +"$2" -- "$1" | head -c "$3"'


@dataclass(frozen=True)
class RemoteFile:
    source: str
    dest: str          # relative to the destination directory, "/"-separated
    size: int
    sha256: str
    growing: bool = False
    prefix_size: int | None = None
    prefix_sha256: str | None = None
    manifest: bool = False  # the sha256 is the one the checkpoint's manifest.json recorded at its save

    @classmethod
    def from_plan(cls, entry: PlanFile) -> "RemoteFile":
        return cls(source=entry.source, dest=entry.dest, size=int(entry.size), sha256=str(entry.sha256),
                   growing=bool(entry.growing), prefix_size=entry.prefix_size, prefix_sha256=entry.prefix_sha256,
                   manifest=bool(entry.manifest))


@dataclass(frozen=True)
class Step:
    """What to do for one file: skip it, or fetch from `offset` (resuming a .part or extending a copy)."""

    file: RemoteFile
    path: Path
    action: str        # "skip", "fetch", "resume", "extend", "replace" (--force over a different file)
    offset: int = 0


class Conflict(OperationFailed):
    """A different file is in the way and --force was not given: nothing was transferred."""


def decide(root: Path, file: RemoteFile, *, force: bool) -> Step | str:
    """The step for one file, or (a str) why a different file in the way stops the pull."""
    path = root.joinpath(*file.dest.split("/"))
    part = path.with_name(path.name + PART_SUFFIX)
    if path.is_file():
        size = path.stat().st_size
        if size == file.size and sha256_of(path) == file.sha256:
            return Step(file, path, "skip")
        if file.growing and file.prefix_size == size and sha256_of(path) == file.prefix_sha256:
            return Step(file, path, "extend", size)
        if not force:
            return f"{shown(path)} differs from {shown(file.source)} ({size} bytes here, {file.size} there)"
        return Step(file, path, "replace")
    if path.exists():
        return f"{shown(path)} is in the way and is not a file"
    if part.is_file() and part.stat().st_size <= file.size:
        return Step(file, path, "resume", part.stat().st_size)
    return Step(file, path, "fetch")


def plan_steps(root: Path, files: list[RemoteFile], *, force: bool) -> list[Step]:
    """Every file's step; Conflict (before anything is transferred) when a different file is in the way."""
    steps, conflicts = [], []
    for file in files:
        step = decide(root, file, force=force)
        (conflicts if isinstance(step, str) else steps).append(step)
    if conflicts:
        raise Conflict("refusing to overwrite what differs (--force replaces it): " + "; ".join(conflicts))
    return steps


def fetch(transport: Transport, step: Step, *, stall: float, on_bytes: Callable[[int], None]) -> int:
    """Bring one file here as the step says; the bytes transferred. Unreachable when the stream is cut (the
    .part stays for the next pull), OperationFailed when what arrived is not what the target hashed or when it
    cannot be written here (the .part stays too)."""
    file, path = step.file, step.path
    part = path.with_name(path.name + PART_SUFFIX)
    try:
        return _fetch(transport, step, part, stall=stall, on_bytes=on_bytes)
    except OSError as exc:
        raise OperationFailed(_unwritable(file, part, exc)) from exc


def _fetch(transport: Transport, step: Step, part: Path, *, stall: float, on_bytes: Callable[[int], None]) -> int:
    file, path = step.file, step.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if step.action == "extend":
        os.replace(path, part)
    elif step.action in ("fetch", "replace"):
        part.unlink(missing_ok=True)
    offset = step.offset
    digest = _digest_of_start(part, offset)
    got = _stream(transport, file, part, offset, digest, stall=stall, on_bytes=on_bytes) if offset < file.size else 0
    if digest.hexdigest() != file.sha256:
        part.unlink(missing_ok=True)
        if offset:  # the bytes kept from before were not the start of this file: once more, from byte 0
            return got + _fetch(transport, Step(file, path, "fetch"), part, stall=stall, on_bytes=on_bytes)
        raise OperationFailed(_mismatch(file, digest.hexdigest()))
    os.replace(part, path)
    return got


def _mismatch(file: RemoteFile, got: str) -> str:
    if file.manifest:  # the target's bytes are not the ones its save recorded: pulling again brings the same
        return (f"{shown(file.source)} is not what its checkpoint's manifest.json recorded (sha256 {got[:16]}..., "
                f"the manifest's {file.sha256[:16]}...): the checkpoint changed on the target after it was saved, "
                f"or its disk damaged it; the copy was removed (another pull brings the same bytes)")
    return (f"{shown(file.source)}: the copy's sha256 {got[:16]}... is not the target's {file.sha256[:16]}... "
            f"(changed while it was read, or damaged); removed, pull again")


def _unwritable(file: RemoteFile, part: Path, exc: OSError) -> str:
    try:
        kept = part.stat().st_size
    except OSError:
        kept = 0
    what = f"{kept} of its {file.size} bytes are kept there: the same pull resumes from them once this " \
           f"machine can write the rest" if kept else "nothing of it was written"
    return f"{shown(file.dest)}: cannot write {shown(exc.filename or part)}: {exc.strerror or exc}; {what}"


def shown(name: object) -> str:
    """A file name or path as a message shows it: the workload chose it, so only as terminal text."""
    return for_terminal(str(name))


def _digest_of_start(part: Path, offset: int):
    """The hash state after the first `offset` bytes of the .part (a resume goes on from there)."""
    if offset:
        os.truncate(part, offset)  # a byte past the offset (written before a cut) is not trusted
    return sha256_state(part, offset)


def _stream(transport: Transport, file: RemoteFile, part: Path, offset: int, digest, *, stall: float,
            on_bytes: Callable[[int], None]) -> int:
    want = file.size - offset
    proc = transport.start(["sh", "-c", RANGE_SCRIPT, "sh", file.source, str(offset + 1), str(want)])
    got = 0
    try:
        with open(part, "ab") as sink:
            while got < want:
                try:
                    chunk = proc.read(timeout=stall)
                except CommandTimeout as exc:
                    raise Unreachable(_cut(file, offset + got, f"no byte for {stall:g}s")) from exc
                except TransportError as exc:
                    raise Unreachable(_cut(file, offset + got, str(exc))) from exc
                if not chunk:
                    break
                sink.write(chunk)
                digest.update(chunk)
                got += len(chunk)
                on_bytes(len(chunk))
    finally:
        proc.close()
    if got < want:
        raise Unreachable(_cut(file, offset + got, "the stream ended early"))
    return got


def _cut(file: RemoteFile, at: int, why: str) -> str:
    return (f"{shown(file.source)}: cut at byte {at} of {file.size} ({why}); the same pull again resumes from there")


__all__ = ["RemoteFile", "Step", "Conflict", "decide", "plan_steps", "fetch", "shown"]
