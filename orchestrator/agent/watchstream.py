"""`watch`: one long-lived process per container that streams what the dashboard needs as JSON lines.

    agent watch --runs-dir D [--gpu-interval S] [--heartbeat S] [--idle-exit S]     (options parsed in cli.py)

stdin (one JSON object a line, from the controller):
    {"follow": {RUN_ID: OFFSET | {"offset": OFFSET, "ino": INODE, "fp": BASE64, "metrics": OFFSET}}}
                                     OFFSET -1: the last 256 KiB (from a line start); fp: the last bytes (<= 64) the
                                     controller has before OFFSET; metrics: where its copy of metrics.jsonl ends
    {"unfollow": [RUN_ID, ...]}      {"ping": 1}
stdout (one JSON object a line, flushed):
    {"t": "runs", "runs": [RECORD...]}          at start and whenever a state.json or the set of runs changes
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
import shutil
import signal
import subprocess
import sys
import time

from .protocol import (FINGERPRINT_BYTES, GPU_FIELDS, MSG_DISK, MSG_GPU, MSG_HEARTBEAT, MSG_LOG, MSG_RESET, MSG_RUNS,
                       MSG_SYNCED, TERMINAL_STATES, ascii_decimal, gpu_query_args, is_run_id)
from .metricsfollow import FollowedMetrics
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

    def send(self, message: dict) -> None:
        self.stream.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
        self.stream.flush()


class FollowedLog:
    """Where the controller's copy of one run's train.log ends."""

    def __init__(self, path: str, offset: int, ino: int | None, fingerprint: bytes = b"",
                 metrics: FollowedMetrics | None = None) -> None:
        self.path = path
        self.metrics = metrics  # the run's metrics.jsonl, sent beside the log
        self.offset = offset  # -1 until the file exists: then its last TAIL_BYTES
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


def tail_start(handle, size: int) -> int:
    """Where the last TAIL_BYTES of a file begin, moved to the start of a line."""
    if size <= TAIL_BYTES:
        return 0
    handle.seek(size - TAIL_BYTES)
    window = handle.read(TAIL_BYTES)
    cut = window.find(b"\n")
    return size - TAIL_BYTES + (cut + 1 if cut >= 0 else 0)


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
            self.followed[run_id] = FollowedLog(paths.log, offset, ino if isinstance(ino, int) else None,
                                                _fingerprint(where, offset),
                                                FollowedMetrics(paths.metrics, where.get("metrics")))

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
            self.out.send({"t": MSG_SYNCED, "runs": synced})

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
                self.out.send({"t": MSG_RESET, "run": run_id, "size": info.st_size, "why": why})
                # the new content from its start (its last TAIL_BYTES if it is bigger, as for a first look)
                log.offset, log.fingerprint = -1, b""
            if log.offset < 0:
                log.offset = tail_start(handle, info.st_size)
            log.ino = info.st_ino
            if info.st_size == log.offset:
                return True
            handle.seek(log.offset)
            data = handle.read(min(MAX_MESSAGE_BYTES, info.st_size - log.offset))
        self.out.send({"t": MSG_LOG, "run": run_id, "offset": log.offset, "ino": log.ino,
                       "data": base64.b64encode(data).decode("ascii")})
        log.sent(data)
        return log.offset >= info.st_size


class RunsWatcher:
    """Sends every run's record when a state.json or the set of runs changes; settles dead supervisors; sends
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
        records = []
        for run_id in run_ids:
            paths = RunPaths(self.runs_dir, run_id)
            note = settle_or_note(paths)
            records.append(dict(load_record(paths), **({"error": note} if note else {})))
        self.signature = self._signature(run_ids)  # after settling, which may have rewritten a state.json
        self.live = [r["run_id"] for r in records if r.get("state") not in TERMINAL_STATES]
        self.out.send({"t": MSG_RUNS, "runs": records})

    def _signature(self, run_ids: list) -> tuple:
        return tuple((run_id, _stamp(RunPaths(self.runs_dir, run_id).state_json)) for run_id in run_ids)


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
            self.out.send({"t": MSG_DISK, "free_bytes": space[0], "total_bytes": space[1]})


def _stamp(path: str) -> tuple:
    """Changes whenever the file is rewritten (state files are replaced by rename: a new inode)."""
    try:
        info = os.stat(path)
    except OSError:
        return ()
    return (info.st_ino, info.st_mtime_ns, info.st_size)


class GpuSampler:
    """One `nvidia-smi --query-gpu=... -l S` child; its rows grouped into one message per sample."""

    def __init__(self, out: Output, interval: float) -> None:
        self.out = out
        self.proc = None
        self.buffer = b""
        self.rows: list = []
        self.indices: set = set()
        self.last_row_at = 0.0
        binary = shutil.which("nvidia-smi")
        if binary is None:
            out.send({"t": MSG_GPU, "error": "nvidia-smi is not installed"})
            return
        # whole seconds with --loop (every nvidia-smi has it); --loop-ms only for sub-second sampling
        loop = "--loop={}".format(int(interval)) if interval >= 1 and interval == int(interval) \
            else "--loop-ms={}".format(max(1, int(interval * 1000)))
        try:
            self.proc = subprocess.Popen([binary] + gpu_query_args(GPU_FIELDS) + [loop],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        except OSError as exc:
            out.send({"t": MSG_GPU, "error": "cannot run nvidia-smi: {}".format(exc)})

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read(self, now: float) -> None:
        data = os.read(self.fileno(), 65536)
        if not data:
            self._ended()
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            index = line.split(",", 1)[0].strip()
            if ascii_decimal(index) is None:
                self.rows.append(line)  # an error message; sent with the sample (or at the end)
                continue
            if index in self.indices:  # the next sample began
                self.flush()
            self.indices.add(index)
            self.rows.append(line)
            self.last_row_at = now

    def flush_if_quiet(self, now: float) -> None:
        # the rows of one sample come in one burst; a short silence ends the sample
        if self.rows and now - self.last_row_at >= 0.05:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.out.send({"t": MSG_GPU, "csv": "\n".join(self.rows)})
        self.rows, self.indices = [], set()

    def _ended(self) -> None:
        code = self.proc.wait()
        text = "\n".join(self.rows + [self.buffer.decode("utf-8", "replace")]).strip()
        self.rows, self.buffer = [], b""
        self.out.send({"t": MSG_GPU, "error": "nvidia-smi exited {}: {}".format(code, text[-500:])})
        self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()  # reaped: no zombie left behind, whatever PID 1 does
        self.proc.stdout.close()
        self.proc = None


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
            out.send({"t": MSG_HEARTBEAT})
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
