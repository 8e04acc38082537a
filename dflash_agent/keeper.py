"""The keeper: one long-lived reaper per runs directory that starts every supervisor as its own child.

Why it exists: a daemon started from `pct exec` ends up a child of the container's PID 1, and when it exits
it becomes PID 1's zombie; a PID 1 that never reaps keeps it forever. Supervisors started by the keeper are
reaped by the keeper instead, and as a child subreaper it also adopts and reaps whatever a dead supervisor
leaves behind. Launch starts the keeper detached (spawn.detach) when none holds its lock: under pct exec it
becomes a child of pct's own process outside the container, then of the host's init, never of the
container's PID 1, so its own exit leaves no zombie either.

A keeper with nothing to do (no child, no live run, no spawn request) for its idle time (10 minutes unless
told) exits, if someone will reap it (exit_is_reaped); one whose parent is a container's PID 1 (started from
inside the container, not through pct exec) stays instead, as that PID 1 may never reap. It decides so under
start.lock, which a launch holds from "is a keeper running?" to "my spawn request is written": either the
launch sees the keeper gone and starts a new one, or the keeper sees the request and stays.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time

from dflash_records.protocol import AGENT_VERSION, iso_utc

from . import identity, lineage, procfs, queuestore
from .childwatch import Wakeup, ignore_signal, reap_children, set_child_subreaper
from .errors import AgentError
from .rundir import RunPaths, file_lock, list_run_ids, read_json, write_json_atomic
from .runstate import is_live, read_run, read_state
from .spawn import agent_entry, detach, entry_env, exec_detached

POLL_S = 1.0
START_TIMEOUT_S = 5.0
LOCK_RETRY_S = 1.0
DEFAULT_IDLE_EXIT_S = 600.0


class KeeperPaths:
    def __init__(self, runs_dir: str) -> None:
        self.dir = os.path.join(os.path.abspath(runs_dir), ".keeper")
        self.lock = os.path.join(self.dir, "keeper.lock")
        self.start_lock = os.path.join(self.dir, "start.lock")
        self.info = os.path.join(self.dir, "keeper.json")
        self.log = os.path.join(self.dir, "keeper.log")
        self.spawn_dir = os.path.join(self.dir, "spawn")

    def request(self, run_id: str) -> str:
        return os.path.join(self.spawn_dir, run_id + ".json")


def keeper_running(paths: KeeperPaths) -> bool:
    """A keeper holds an flock on keeper.lock for its whole life; the kernel drops it when it dies."""
    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def start_and_request(runs_dir: str, run_id: str, *, entry: list, env: dict, log_path: str,
                      idle_exit: float | None = None) -> dict:
    """Make sure a keeper runs, ask it to start `supervise` for run_id, and wake it; returns keeper.json.

    Both under start.lock, so a keeper that is leaving because it was idle never misses the request.
    """
    paths = KeeperPaths(runs_dir)
    os.makedirs(paths.spawn_dir, mode=0o700, exist_ok=True)
    argv = entry + ["supervise", "--runs-dir", os.path.abspath(runs_dir), "--run-id", run_id]
    with file_lock(paths.start_lock):
        _start_unless_running(paths, runs_dir, entry, env, idle_exit)
        write_json_atomic(paths.request(run_id), {"version": 1, "argv": argv, "env": env, "log": log_path},
                          mode=0o600)
    return wake(runs_dir)


def ensure_keeper(runs_dir: str, *, entry: list, env: dict, idle_exit: float | None = None) -> dict:
    """Make sure a keeper runs and wake it (to take the queue's turn: queued runs wait for it); keeper.json."""
    paths = KeeperPaths(runs_dir)
    os.makedirs(paths.spawn_dir, mode=0o700, exist_ok=True)
    with file_lock(paths.start_lock):
        _start_unless_running(paths, runs_dir, entry, env, idle_exit)
    return wake(runs_dir)


def _start_unless_running(paths: KeeperPaths, runs_dir: str, entry: list, env: dict,
                          idle_exit: float | None) -> None:
    """Under start.lock: a keeper that leaves idle decides so under it too."""
    if keeper_running(paths):
        return
    idle = [] if idle_exit is None else ["--idle-exit", "{:g}".format(idle_exit)]
    detach(entry + ["keeper", "--runs-dir", os.path.abspath(runs_dir)] + idle, env, paths.log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not keeper_running(paths) and time.monotonic() < deadline:
        time.sleep(0.01)


def wake(runs_dir: str) -> dict:
    """SIGUSR1 to the keeper keeper.json names, proven so; keeper.json."""
    paths = KeeperPaths(runs_dir)
    info = read_json(paths.info) or {}
    pid = info.get("pid")
    # SIGUSR1 ends a process that does not handle it: only the keeper keeper.json names, proven so, gets one
    if isinstance(pid, int) and procfs.is_alive(pid, info.get("start_time")) and identity.not_ours(
            pid, info.get("start_time"), identity.KEEPER, runs_dir) is None:
        try:
            os.kill(info["pid"], signal.SIGUSR1)
        except OSError:
            pass  # it polls the spawn directory anyway
    return info


def cancel_spawn(runs_dir: str, run_id: str) -> bool:
    try:
        os.unlink(KeeperPaths(runs_dir).request(run_id))
    except OSError:
        return False
    return True


class Keeper:
    def __init__(self, runs_dir: str, *, idle_exit: float = DEFAULT_IDLE_EXIT_S) -> None:
        self.paths = KeeperPaths(runs_dir)
        self.runs_dir = os.path.abspath(runs_dir)
        self.idle_exit = idle_exit
        self.stopping = False
        self.staying = False
        self.children = set()
        self.known = lineage.load_known(self.paths.dir)  # (pid, start time) -> run id of what is below us
        entry, pythonpath = agent_entry()
        self.entry, self.env = entry, entry_env(os.environ, pythonpath)  # what a queued run's starter runs

    def run(self) -> int:
        # Handlers first: a launch may SIGUSR1 us as soon as keeper.json names us, and its default kills.
        wakeup = Wakeup({signal.SIGCHLD: ignore_signal, signal.SIGUSR1: ignore_signal,
                         signal.SIGTERM: self._on_term, signal.SIGINT: self._on_term, signal.SIGHUP: ignore_signal})
        os.makedirs(self.paths.spawn_dir, mode=0o700, exist_ok=True)
        lock_fd = _take_lock(self.paths.lock)
        if lock_fd is None:
            return 1  # another keeper owns this runs directory
        set_child_subreaper()
        pid = os.getpid()
        write_json_atomic(self.paths.info, {"version": 1, "pid": pid, "start_time": procfs.start_time(pid),
                                            "started_at": iso_utc(), "agent_version": AGENT_VERSION,
                                            "idle_exit_s": self.idle_exit})
        idle_since = time.monotonic()
        while not (self.stopping and not self.children):
            self._reap()
            if not self.stopping:
                self._spawn_requested()
                self._queue_turn()
            self._track()
            if self.children or self._requests() or queuestore.has_entries(self.runs_dir):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.idle_exit and self._may_leave():
                if self._leave_if_idle(lock_fd):
                    _log("idle for {:g}s with no live run: exiting".format(self.idle_exit))
                    return 0
                idle_since = time.monotonic()  # a live run or an orphan of one is still here: look again later
            wakeup.wait(min(POLL_S, max(self.idle_exit, 0.01)))
        return 0

    def _may_leave(self) -> bool:
        if exit_is_reaped():
            return True
        if not self.staying:
            self.staying = True
            _log("idle, but staying: no one here may ever reap this keeper (its parent is this container's PID 1)")
        return False

    def _idle(self) -> bool:
        """No child of ours (supervisors, adopted orphans), no live run, no spawn request."""
        if self.children or _has_children(os.getpid()) or self._requests() or queuestore.has_entries(self.runs_dir):
            return False
        return not any(_live(self.runs_dir, run_id) for run_id in list_run_ids(self.runs_dir))

    def _leave_if_idle(self, lock_fd: int) -> bool:
        """Give up keeper.lock, under start.lock, if still idle: launches from then on start a new keeper."""
        with file_lock(self.paths.start_lock):
            if not self._idle():
                return False
            os.close(lock_fd)
            return True

    def _requests(self) -> list:
        try:
            return sorted(n for n in os.listdir(self.paths.spawn_dir) if n.endswith(".json"))
        except OSError:
            return []

    def _on_term(self, signum, frame) -> None:
        # Leave only once every supervisor we started is gone: they must have a parent that reaps them.
        self.stopping = True

    def _reap(self) -> None:
        for pid, status in reap_children():
            self.children.discard(pid)
            _log("reaped pid {} (status {})".format(pid, status))

    def _track(self) -> None:
        """Record the run of every process below us, so an orphan keeps its run once the chain of parents that
        tied it to the workload breaks (lineage.py). Nothing to walk while only our supervisors are below us."""
        me = os.getpid()
        if not self.known and not (_child_pids(me) - self.children):
            return
        found = lineage.attribute(procfs.snapshot(), me, lambda: lineage.run_states(self.runs_dir), self.known)
        if found != self.known:
            self.known = found
            lineage.save_known(self.paths.dir, found)

    def _spawn_requested(self) -> None:
        for name in self._requests():
            self._spawn_one(os.path.join(self.paths.spawn_dir, name))

    def _spawn_one(self, path: str) -> None:
        request = read_json(path)
        try:
            os.unlink(path)
        except OSError:
            return
        if not request or not isinstance(request.get("argv"), list) or not isinstance(request.get("env"), dict):
            _log("ignored malformed spawn request {}".format(path))
            return
        env = {str(k): str(v) for k, v in request["env"].items()}
        child = self._fork_exec([str(a) for a in request["argv"]], env, str(request.get("log") or os.devnull))
        _log("started supervisor pid {}: {}".format(child, json.dumps(request["argv"][-4:])))

    def _fork_exec(self, argv: list, env: dict, log: str) -> int:
        child = os.fork()
        if child == 0:
            os.setsid()
            exec_detached(argv, env, log)
        self.children.add(child)
        return child

    def _queue_turn(self) -> None:
        """Start the queued runs whose GPUs are free, first in first: each in a starter of its own (start-queued:
        its check, its supervisor, its verification), our child, so that its exit wakes us for the next turn."""
        from .scheduler import starter_argv, take_turn
        try:
            started = take_turn(self.runs_dir)
        except Exception as exc:  # noqa: BLE001 - a queue we cannot read must not end the reaper of every run
            _log("queue turn failed: {}: {}".format(type(exc).__name__, exc))
            return
        for entry in started:
            log = os.path.join(self.runs_dir, entry.run_id, "supervisor.log")
            spawned = not entry.check_argv
            if spawned:  # nothing to check first: its supervisor at once, the starter only verifies it
                self._fork_exec(self.entry + ["supervise", "--runs-dir", self.runs_dir, "--run-id", entry.run_id],
                                self.env, log)
            # its answer and any trouble land beside the run's supervisor's own log
            child = self._fork_exec(self.entry + starter_argv(entry, self.runs_dir, spawned=spawned), self.env, log)
            _log("started queued run {} (starter pid {})".format(entry.run_id, child))


def exit_is_reaped() -> bool:
    """Someone will reap us when we exit: a parent outside our PID namespace (pct exec's process, then the
    host's init: spawn.detach), or the host's own init. Inside a container no one can tell whether its PID 1
    ever reaps."""
    return os.getppid() == 0 or procfs.in_initial_pid_namespace()


def _take_lock(path: str) -> int | None:
    """Hold keeper.lock for life (the fd returned stays open and locked until we exit or leave idle).
    Retry briefly: a launch's liveness probe may hold it for an instant."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def _child_pids(pid: int) -> set:
    """Our children, from one small file where the kernel lists them; a walk of /proc where it does not."""
    try:
        with open("/proc/{0}/task/{0}/children".format(pid)) as handle:
            return {int(word) for word in handle.read().split()}
    except (OSError, ValueError):
        return {stat.pid for stat in procfs.snapshot().values() if stat.ppid == pid}


def _has_children(pid: int) -> bool:
    table = procfs.snapshot()
    return any(stat.ppid == pid for stat in table.values())


def _live(runs_dir: str, run_id: str) -> bool:
    try:
        paths = RunPaths(runs_dir, run_id)
    except AgentError:
        return False
    return is_live(paths, read_run(paths), read_state(paths))


def _log(message: str) -> None:
    try:
        print("{} {}".format(iso_utc(), message), file=sys.stderr, flush=True)
    except OSError:
        pass  # a full disk must not end the reaper of every run (its log is in the runs directory)


def run_keeper(runs_dir: str, *, idle_exit: float = DEFAULT_IDLE_EXIT_S) -> int:
    return Keeper(runs_dir, idle_exit=idle_exit).run()
