"""Layout of a runs directory, validation of what names a run, and crash-safe JSON files."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile

from dflash_records.protocol import MAX_GPU_INDEX, NO_GPUS, ascii_decimal, env_pair, is_run_id

from .errors import BadInput, OperationFailed


def validate_name(value: str, *, what: str) -> str:
    if not is_run_id(value):
        raise BadInput(
            "invalid {}: {!r}{} (allowed: a letter or digit, then up to 63 of letters, digits, '.', '_', '-')".format(
                what, value[:80] if isinstance(value, str) else value,
                " ({} characters)".format(len(value)) if isinstance(value, str) and len(value) > 80 else ""),
            code="bad_" + what.replace(" ", "_"),
        )
    return value


def validate_target(value: str) -> str:
    if not value or len(value) > 200 or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise BadInput("invalid target: {!r}".format(value), code="bad_target")
    return value


def parse_gpus(text: str) -> list:
    """`0,1` into [0, 1]; `none` into [] (the run sees no GPU and holds none)."""
    if text == NO_GPUS:
        return []
    gpus = [ascii_decimal(part) for part in text.split(",")]
    if None in gpus:
        raise BadInput("invalid --gpus {!r}: expected a comma-separated list like 0,1".format(text), code="bad_gpus")
    if any(g < 0 or g > MAX_GPU_INDEX for g in gpus) or len(set(gpus)) != len(gpus):
        raise BadInput("invalid --gpus {!r}: indices must be distinct and in 0..{}".format(text, MAX_GPU_INDEX),
                       code="bad_gpus")
    return gpus


def parse_env_pairs(pairs: list) -> dict:
    env = {}
    for pair in pairs:
        try:
            key, value = env_pair(pair)
        except ValueError as exc:
            raise BadInput("invalid --env {!r}: {}".format(pair, exc), code="bad_env") from None
        env[key] = value
    return env


def launch_lock(runs_dir: str) -> str:
    """The lock held by whoever decides about GPUs and creates or starts a run: one launch, one enqueue or one
    turn of the queue at a time, so two cannot take the same GPU."""
    os.makedirs(runs_dir, mode=0o700, exist_ok=True)
    return os.path.join(runs_dir, ".launch.lock")


RUN_DIR_FILES = ("run.json", "state.json", "train.log", "supervisor.log", "kill_request.json", "metrics.jsonl")


class RunPaths:
    """Where one run's files live: `{runs_dir}/{run_id}/`."""

    def __init__(self, runs_dir: str, run_id: str) -> None:
        self.runs_dir = os.path.abspath(runs_dir)
        self.run_id = validate_name(run_id, what="run id")
        self.dir = os.path.join(self.runs_dir, run_id)
        self.run_json = os.path.join(self.dir, "run.json")
        self.state_json = os.path.join(self.dir, "state.json")
        self.log = os.path.join(self.dir, "train.log")
        self.metrics = os.path.join(self.dir, "metrics.jsonl")
        self.supervisor_log = os.path.join(self.dir, "supervisor.log")
        self.kill_request = os.path.join(self.dir, "kill_request.json")
        self.lock = os.path.join(self.dir, ".lock")
        self.reserve = os.path.join(self.dir, ".state-reserve")

    def exists(self) -> bool:
        return os.path.isfile(self.run_json)


def _is_run_dir(path: str) -> bool:
    """A real directory (not a link to one) holding a real run.json: the run tree is never left by a link."""
    try:
        return (stat.S_ISDIR(os.lstat(path).st_mode)
                and stat.S_ISREG(os.lstat(os.path.join(path, "run.json")).st_mode))
    except OSError:
        return False


def _run_names(runs_dir: str) -> list:
    try:
        return sorted(n for n in os.listdir(runs_dir) if is_run_id(n))
    except FileNotFoundError:
        return []


def list_run_ids(runs_dir: str) -> list:
    return [n for n in _run_names(runs_dir) if _is_run_dir(os.path.join(runs_dir, n))]


def unfollowed_run_dirs(runs_dir: str) -> list:
    """What is named like a run but is a symbolic link (or holds a linked run.json): never read or written
    through, only reported, since its files would land wherever the link points."""
    found = []
    for name in _run_names(runs_dir):
        path = os.path.join(runs_dir, name)
        if not _is_run_dir(path) and os.path.isfile(os.path.join(path, "run.json")):
            found.append({"run_id": name, "path": path, "points_to": os.path.realpath(path),
                          "reason": "a symbolic link out of the run tree: not followed"})
    return found


def existing_run(runs_dir: str, run_id: str) -> RunPaths:
    paths = RunPaths(runs_dir, run_id)
    if not _is_run_dir(paths.dir):
        if paths.exists():
            raise OperationFailed("run {}: its directory {} is a symbolic link out of the run tree: not "
                                  "followed".format(run_id, paths.dir), code="run_dir_link")
        raise BadInput("unknown run: {}".format(run_id), code="unknown_run")
    return paths


def write_json_atomic(path: str, data: dict, *, mode: int = 0o644) -> None:
    """Write so that a reader (or a crash) sees the old file or the new one, never half of one."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


# Space kept for the run's state.json: a workload that fills the disk with its log must not take from the
# supervisor the room to record how the run ended. Released (deleted) only by a state write that hit ENOSPC.
STATE_RESERVE_BYTES = 64 * 1024


def make_reserve(path: str) -> None:
    with open(path, "wb") as handle:
        handle.write(b"\0" * STATE_RESERVE_BYTES)
        handle.flush()
        os.fsync(handle.fileno())


def release_reserve(path: str) -> bool:
    """Free the reserved space; False when there was none left to free."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def disk_full(directory: str) -> bool:
    """The filesystem of `directory` has (next to) no room left for unprivileged writes."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < STATE_RESERVE_BYTES


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: str) -> dict | None:
    """The JSON object in `path`; None when there is none. A symbolic link is not followed."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def file_lock(path: str):
    """An exclusive flock, released when the block ends (or the holder dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def tail_bytes(path: str, count: int) -> str:
    """The last `count` bytes of a file, decoded leniently ("" when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - count))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tail_lines(path: str, count: int, *, max_bytes: int = 256 * 1024) -> list:
    """The last `count` lines of a file, reading at most `max_bytes` from its end."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-count:] if count > 0 else []
