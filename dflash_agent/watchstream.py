"""`watch`: one long-lived process per container that streams what the dashboard needs as JSON lines.

    agent watch --runs-dir D [--gpu-interval S] [--heartbeat S] [--idle-exit S]     (options parsed in cli.py)

stdin (one JSON object a line, from the controller):
    {"follow": {RUN_ID: OFFSET | {"offset": OFFSET, "ino": INODE, "fp": BASE64, "metrics": OFFSET,
                                  "tail": BYTES}}}
                                     OFFSET -1: the last 256 KiB (from a line start), or the last `tail` bytes when
                                     fewer are asked for (a one-shot snapshot's first look); fp: the last bytes
                                     (<= 64) the controller has before OFFSET; metrics: where its copy of
                                     metrics.jsonl ends (-1: its tail, as the log's)
    {"unfollow": [RUN_ID, ...]}      {"ping": 1}
stdout (one JSON object a line, flushed; each kind a dataclass of dflash_records/watchwire.py, its codec beside it):
    {"t": "runs", "runs": [RECORD...]}          at start and whenever a state.json, the set of runs or the queue
                                                changes (a queued run's record has its `queue_position`, as ps)
    {"t": "log", "run": ID, "offset": N, "ino": I, "data": BASE64}   new bytes of train.log from byte N
    {"t": "reset", "run": ID, "size": N, "why": truncated|replaced|rewritten}   restart its parser: the bytes
                                                before the offset are no longer what was sent (fp), so the new
                                                content is sent from its start
    {"t": "metrics", "run": ID, "offset": N, "data": BASE64}   new whole lines of the run's metrics.jsonl, the
                                                trainer's exact figures (metricsfollow.py)
    {"t": "synced", "runs": [ID...]}            these followed logs (and metrics) have been sent up to their end
    {"t": "gpu", "csv": TEXT} | {"t": "gpu", "error": TEXT}    one sample of one looping nvidia-smi
    {"t": "disk", "free_bytes": N, "total_bytes": N}   free space where the runs are written, at start and
                                                every DISK_POLL_S while it changes
    {"t": "hb"}                                 every HEARTBEAT_S, so the controller can tell a dead link
The process ends when stdin closes (or no command came for --idle-exit seconds: a controller behind a dead
link never closes it), and takes its nvidia-smi child with it.
"""
from __future__ import annotations

import base64
import json
import os
import select
import signal
import sys
import time

from dflash_records.protocol import FINGERPRINT_BYTES, TERMINAL_STATES, is_run_id
from dflash_records.run import RunRecord
from dflash_records.watchwire import DiskMessage, Heartbeat, LogMessage, ResetMessage, RunsMessage, SyncedMessage

from . import queuestore
from .gpusampler import GpuSampler
from .metricsfollow import TAIL_BYTES as METRICS_TAIL_BYTES
from .metricsfollow import FollowedMetrics
from .queuelaunch import QueuePlaces
from .rundir import RunPaths, list_run_ids
from .runstate import load_record, settle_or_note

TAIL_BYTES = 256 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024
LOG_POLL_S = 0.1
RUNS_POLL_S = 0.5
LIVENESS_POLL_S = 2.0
HEARTBEAT_S = 5.0
DISK_POLL_S = 5.0


class Output:
    """JSON lines on stdout. Blocking writes: a controller that reads slowly slows the agent, nothing is lost."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def send(self, message) -> None:
        """One message of dflash_records.watchwire, as its JSON line."""
        self.stream.write((json.dumps(message.to_wire(), separators=(",", ":")) + "\n").encode())
        self.stream.flush()


class FollowedLog:
    """Where the controller's copy of one run's train.log ends."""

    def __init__(self, path: str, offset: int, ino: int | None, fingerprint: bytes = b"",
                 metrics: FollowedMetrics | None = None, tail: int = TAIL_BYTES) -> None:
        self.path = path
        self.metrics = metrics  # the run's metrics.jsonl, sent beside the log
        self.offset = offset  # -1 until the file exists: then its last `tail` bytes
        self.tail = tail
        self.ino = ino
        self.fingerprint = fingerprint  # the last bytes sent before `offset`
        self.synced = False

    def changed(self, handle, info) -> str | None:
        """Why the file is no longer the one sent up to `offset` (None while it is)."""
        if self.offset < 0:
            return None
        if self.ino is not None and self.ino != info.st_ino:
            return "replaced"
        if info.st_size < self.offset:
            return "truncated"
        if self.fingerprint:
            handle.seek(self.offset - len(self.fingerprint))
            if handle.read(len(self.fingerprint)) != self.fingerprint:
                return "rewritten"
        return None

    def sent(self, data: bytes) -> None:
        self.offset += len(data)
        self.fingerprint = (self.fingerprint + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]


def _fingerprint(where: dict, offset: int) -> bytes:
    try:
        raw = base64.b64decode(where.get("fp") or "", validate=True)
    except (ValueError, TypeError):
        return b""
    return raw[-FINGERPRINT_BYTES:] if 0 < len(raw) <= offset else b""


def tail_start(handle, size: int, tail: int = TAIL_BYTES) -> int:
    """Where the last `tail` bytes of a file begin, moved to the start of a line."""
    if size <= tail:
        return 0
    handle.seek(size - tail)
    window = handle.read(tail)
    cut = window.find(b"\n")
    return size - tail + (cut + 1 if cut >= 0 else 0)


def first_look(where: dict, cap: int) -> int:
    """How much of a file's end a first look sends: `cap`, or the fewer bytes the controller asked for."""
    tail = where.get("tail")
    return min(cap, tail) if isinstance(tail, int) and not isinstance(tail, bool) and tail > 0 else cap


class LogPump:
    """Polls the followed logs by size and sends what is new, at most MAX_MESSAGE_BYTES a message."""

    def __init__(self, runs_dir: str, out: Output) -> None:
        self.runs_dir = runs_dir
        self.out = out
        self.followed: dict = {}

    def follow(self, wanted: dict) -> None:
        for run_id, where in wanted.items():
            if not is_run_id(run_id):
                continue
            where = where if isinstance(where, dict) else {"offset": where}
            offset, ino = where.get("offset"), where.get("ino")
            offset = offset if isinstance(offset, int) and not isinstance(offset, bool) else -1
            paths = RunPaths(self.runs_dir, run_id)
            metrics = FollowedMetrics(paths.metrics, where.get("metrics"), first_look(where, METRICS_TAIL_BYTES))
            self.followed[run_id] = FollowedLog(paths.log, offset, ino if isinstance(ino, int) else None,
                                                _fingerprint(where, offset), metrics, first_look(where, TAIL_BYTES))

    def unfollow(self, run_ids: list) -> None:
        for run_id in run_ids if isinstance(run_ids, list) else []:
            self.followed.pop(run_id, None)

    def poll(self) -> None:
        synced = []
        for run_id, log in list(self.followed.items()):
            # the exact figures first: a snapshot taken once a log is synced has the records of its step lines
            metrics_sent = log.metrics is None or log.metrics.pump(run_id, self.out.send)
            if self._pump(run_id, log) and metrics_sent and not log.synced:
                log.synced = True
                synced.append(run_id)
        if synced:
            self.out.send(SyncedMessage(tuple(synced)))

    def _pump(self, run_id: str, log: FollowedLog) -> bool:
        """Send one message of new bytes; True once the log has been sent up to its current end."""
        try:
            handle = open(log.path, "rb")
        except OSError:
            return True  # no log yet: nothing to send, nothing missing
        with handle:
            info = os.fstat(handle.fileno())
            why = log.changed(handle, info)
            if why is not None:
                self.out.send(ResetMessage(run_id, info.st_size, why))
                # the new content from its start (its last bytes if it is bigger, as for a first look)
                log.offset, log.fingerprint = -1, b""
            if log.offset < 0:
                log.offset = tail_start(handle, info.st_size, log.tail)
            log.ino = info.st_ino
            if info.st_size == log.offset:
                return True
            handle.seek(log.offset)
            data = handle.read(min(MAX_MESSAGE_BYTES, info.st_size - log.offset))
        self.out.send(LogMessage(run_id, log.offset, data, log.ino))
        log.sent(data)
        return log.offset >= info.st_size


class RunsWatcher:
    """Sends every run's record when a state.json, the set of runs or the queue changes; settles dead supervisors; sends
    the free space where they are written."""

    def __init__(self, runs_dir: str, out: Output) -> None:
        self.runs_dir = runs_dir
        self.out = out
        self.signature: tuple | None = None
        self.live: list = []
        self.next_liveness = 0.0
        self.disk = DiskWatcher(runs_dir, out)
        self.next_disk = 0.0

    def poll(self, now: float) -> None:
        if now >= self.next_disk:  # before the first runs message: a one-shot snapshot has it too
            self.next_disk = now + DISK_POLL_S
            self.disk.poll()
        run_ids = list_run_ids(self.runs_dir)
        if now >= self.next_liveness:
            self.next_liveness = now + LIVENESS_POLL_S
            for run_id in self.live:
                if run_id in run_ids:
                    settle_or_note(RunPaths(self.runs_dir, run_id))
        if self._signature(run_ids) == self.signature:
            return
        records, places = [], QueuePlaces(self.runs_dir)
        for run_id in run_ids:
            paths = RunPaths(self.runs_dir, run_id)
            note = settle_or_note(paths)
            record = dict(load_record(paths), **({"error": note} if note else {}))
            records.append(RunRecord.from_dict(places.add_to(run_id, record)))
        self.signature = self._signature(run_ids)  # after settling, which may have rewritten a state.json
        self.live = [r.run_id for r in records if r.state not in TERMINAL_STATES]
        self.out.send(RunsMessage(tuple(records)))

    def _signature(self, run_ids: list) -> tuple:
        # the queue's files too: a run leaving the queue changes the place of every run behind it
        return (tuple((run_id, _stamp(RunPaths(self.runs_dir, run_id).state_json)) for run_id in run_ids),
                tuple(map(_stamp, queuestore.files(self.runs_dir))))


class DiskWatcher:
    """Sends the free space of the filesystem the runs are written to (their logs, state and checkpoints)."""

    def __init__(self, runs_dir: str, out: Output) -> None:
        self.runs_dir = runs_dir
        self.out = out
        self.last: tuple | None = None

    def poll(self) -> None:
        where = os.path.abspath(self.runs_dir)
        while not os.path.exists(where) and where != "/":
            where = os.path.dirname(where)  # no run yet: the workdir (or a parent) it will be made in
        try:
            stat = os.statvfs(where)
        except OSError:
            return
        space = (stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize)
        if space != self.last:
            self.last = space
            self.out.send(DiskMessage(space[0], space[1]))


def _stamp(path: str) -> tuple:
    """Changes whenever the file is rewritten (state files are replaced by rename: a new inode)."""
    try:
        info = os.stat(path)
    except OSError:
        return ()
    return (info.st_ino, info.st_mtime_ns, info.st_size)


class Commands:
    """The controller's JSON lines on stdin."""

    def __init__(self, pump: LogPump) -> None:
        self.pump = pump
        self.buffer = b""
        self.closed = False
        self.last_at = time.monotonic()

    def read(self, now: float) -> None:
        data = os.read(0, 65536)
        self.last_at = now
        if not data:
            self.closed = True
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self._apply(line)

    def _apply(self, line: bytes) -> None:
        try:
            command = json.loads(line)
        except ValueError:
            return
        if not isinstance(command, dict):
            return
        if isinstance(command.get("follow"), dict):
            self.pump.follow(command["follow"])
        if "unfollow" in command:
            self.pump.unfollow(command["unfollow"])


def watch(runs_dir: str, *, gpu_interval: float = 1.0, idle_exit: float = 0.0,
          heartbeat: float = HEARTBEAT_S) -> int:
    out = Output(sys.stdout.buffer)
    pump, runs = LogPump(runs_dir, out), RunsWatcher(runs_dir, out)
    commands = Commands(pump)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # unwind through `finally`, which ends nvidia-smi
        signal.signal(signum, _exit_on_signal)
    gpus = GpuSampler(out, gpu_interval)
    try:
        _loop(commands, pump, runs, gpus, out, idle_exit=idle_exit, heartbeat=heartbeat or HEARTBEAT_S)
    except BrokenPipeError:
        pass
    finally:
        gpus.stop()
    return 0


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _loop(commands: Commands, pump: LogPump, runs: RunsWatcher, gpus: GpuSampler, out: Output, *,
          idle_exit: float, heartbeat: float) -> None:
    next_runs = next_log = 0.0
    next_beat = time.monotonic() + heartbeat
    while not commands.closed:
        now = time.monotonic()
        if idle_exit and now - commands.last_at > idle_exit:
            return
        if now >= next_runs:
            runs.poll(now)
            next_runs = now + RUNS_POLL_S
        if now >= next_log:
            pump.poll()
            next_log = now + LOG_POLL_S
        if now >= next_beat:
            out.send(Heartbeat())
            next_beat = now + heartbeat
        readers = [0] + ([gpus] if gpus.proc is not None else [])
        wait = max(0.0, min(next_runs, next_log) - time.monotonic())
        ready, _, _ = select.select(readers, [], [], min(wait, 0.05) if gpus.rows else wait)
        now = time.monotonic()
        if 0 in ready:
            commands.read(now)
        if gpus in ready:
            gpus.read(now)
        gpus.flush_if_quiet(now)
