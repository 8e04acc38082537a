"""The supervisor of one run: starts the workload, reaps everything, records how it ended, and on SIGTERM
ends every process of the run (TERM, grace, KILL) before it writes the terminal state.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback

from . import procfs
from .childwatch import Wakeup, decode_status, ignore_signal, reap_children, set_child_subreaper, signal_name
from .errors import OperationFailed
from .protocol import DEFAULT_GRACE_S, FAILED, KILLED, RUNNING, STARTING, SUCCEEDED
from .rundir import RunPaths, disk_full, existing_run, read_json, utc_now_iso, write_json_atomic
from .runstate import DISK_FULL, finish, read_run, update_state

LEFTOVER_GRACE_S = 5.0
POLL_S = 0.1
KILL_ROUNDS = 100
KILL_PAUSE_S = 0.05
# Once the workload has exited by itself, the longest the supervisor spends ending what it left behind (their
# grace, then every KILL round) before it records how the run ended; a launch waits that long for the record.
LEFTOVERS_LIMIT_S = LEFTOVER_GRACE_S + KILL_ROUNDS * KILL_PAUSE_S


class Supervisor:
    def __init__(self, paths: RunPaths, *, grace: float | None) -> None:
        self.paths = paths
        self.grace_override = grace
        self.run = read_run(paths)
        self.pid = os.getpid()
        self.start_time = procfs.start_time(self.pid)
        self.workload_pid = None
        self.workload_pgid = None
        self.workload_status = None
        self.term_signal = None

    # -- start ---------------------------------------------------------------------------------------
    def claim(self) -> bool:
        """Record ourselves as the run's supervisor, only if the run still waits for one."""
        def mutate(state: dict):
            if state.get("state") != STARTING or state.get("supervisor_pid"):
                return None
            state.update(supervisor_pid=self.pid, supervisor_start_time=self.start_time,
                         supervisor_boot_id=procfs.boot_id())
            return state
        state = update_state(self.paths, mutate)
        if state.get("supervisor_pid") != self.pid:
            return False
        self.run.update(supervisor_pid=self.pid, supervisor_start_time=self.start_time)
        write_json_atomic(self.paths.run_json, self.run)
        return True

    def workload_env(self) -> dict:
        env = dict(os.environ)
        env.update(self.run.get("env") or {})
        inherited = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        if self.run.get("pythonpath"):
            env["PYTHONPATH"] = os.pathsep.join(list(self.run["pythonpath"]) + inherited)
        env["DFLASH_RUN_ID"] = self.paths.run_id
        env["DFLASH_RUNS_DIR"] = self.paths.runs_dir
        env["DFLASH_RUN_DIR"] = self.paths.dir
        env.setdefault("PYTHONUNBUFFERED", "1")  # a Python workload's log must not sit in a buffer for hours
        if self.run.get("gpus") is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.run["gpus"])
        return env

    def start_workload(self) -> None:
        log_fd = os.open(self.paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            proc = subprocess.Popen(self.run["command"], cwd=self.run.get("cwd") or "/", env=self.workload_env(),
                                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, restore_signals=True)
        finally:
            os.close(log_fd)
        self.workload_pid = proc.pid
        self.workload_pgid = proc.pid  # start_new_session: the workload leads its own session and group
        self._popen = proc  # keep it referenced; we reap it ourselves with waitpid(-1)
        pid_start = procfs.start_time(proc.pid)

        def mutate(state: dict):
            state.update(state=RUNNING, pid=proc.pid, pgid=proc.pid, pid_start_time=pid_start,
                         started_at=utc_now_iso())
            return state
        update_state(self.paths, mutate)

    def fail_to_start(self, exc: Exception) -> None:
        program = (self.run.get("command") or ["?"])[0]
        if isinstance(exc, FileNotFoundError) and exc.filename in (None, program):
            reason = "command not found: {}".format(program)
        elif isinstance(exc, PermissionError) and exc.filename in (None, program):
            reason = "permission denied: {}".format(program)
        else:
            reason = "cannot start {!r}: {}".format(self.run.get("command"), exc)
        with open(self.paths.log, "a") as log:
            log.write("dflash: {}\n".format(reason))
        # the shell's codes for the same mistakes
        code = 126 if isinstance(exc, PermissionError) else 127
        finish(self.paths, FAILED, exit_code=code, signal=None, error=reason)

    # -- run -----------------------------------------------------------------------------------------
    def on_term(self, signum, frame) -> None:
        self.term_signal = signum

    def reap(self) -> None:
        for pid, status in reap_children():
            if pid == self.workload_pid:
                self.workload_status = status
                self._popen.returncode = status  # so Popen never waits for it again

    def grace(self) -> float:
        if self.grace_override is not None:
            return self.grace_override
        request = read_json(self.paths.kill_request) or {}
        for source in (request, self.run):
            if isinstance(source.get("grace_s"), (int, float)):
                return float(source["grace_s"])
        return DEFAULT_GRACE_S

    def run_processes(self) -> list:
        """Live processes of this run: our descendants (we are their subreaper, so none leaves our tree). Not
        whatever carries our DFLASH_RUN_ID: anyone can set that."""
        table = procfs.snapshot()
        pids = {p for p in procfs.descendants(table, self.pid) if not table[p].is_zombie}
        pids.discard(self.pid)
        return [(pid, table[pid].start_time) for pid in sorted(pids) if pid in table]

    def signal_all(self, sig: int) -> None:
        # Once the workload is reaped its pgid may be reused by a stranger; its group's members are our
        # descendants anyway (we are their subreaper), so the walk below still reaches them.
        if self.workload_pgid and self.workload_status is None:
            try:
                os.killpg(self.workload_pgid, sig)
            except OSError:
                pass
        for pid, start in self.run_processes():
            if procfs.is_alive(pid, start):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass

    def end_everything(self, grace: float, wakeup: Wakeup) -> None:
        """TERM all, wait up to `grace`, then KILL until nothing of the run is left, reaping as we go."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if not self.run_processes():
                return
            wakeup.wait(POLL_S)
        for _ in range(KILL_ROUNDS):
            self.reap()
            if not self.run_processes():
                return
            self.signal_all(signal.SIGKILL)
            time.sleep(KILL_PAUSE_S)
        print("warning: processes survived SIGKILL: {}".format(self.run_processes()), file=sys.stderr)

    def loop(self, wakeup: Wakeup) -> None:
        while self.workload_status is None and self.term_signal is None:
            self.reap()
            if self.workload_status is None and self.term_signal is None:
                wakeup.wait(1.0)

    def conclude(self) -> dict:
        exit_code, sig = decode_status(self.workload_status) if self.workload_status is not None else (None, None)
        # a full disk is most likely why it ended (its log could not be written): say so beside the exit code
        why = {"error": DISK_FULL} if disk_full(self.paths.dir) else {}
        if self.term_signal is not None:
            sig = sig if sig is not None else signal.SIGTERM
            return finish(self.paths, KILLED, exit_code=exit_code, signal=sig, signal_name=signal_name(sig), **why)
        if exit_code == 0:
            return finish(self.paths, SUCCEEDED, exit_code=0, signal=None, **why)
        return finish(self.paths, FAILED, exit_code=exit_code, signal=sig, signal_name=signal_name(sig), **why)

def supervise(runs_dir: str, run_id: str, *, grace: float | None = None) -> dict:
    paths = existing_run(runs_dir, run_id)
    set_child_subreaper()
    sup = Supervisor(paths, grace=grace)
    wakeup = Wakeup({signal.SIGCHLD: ignore_signal, signal.SIGTERM: sup.on_term, signal.SIGINT: sup.on_term,
                     signal.SIGHUP: ignore_signal})
    if not sup.claim():
        raise OperationFailed("run {} is not waiting for a supervisor".format(run_id), code="not_startable")
    if sup.term_signal is not None:  # killed between the keeper's fork and now: never start the workload
        return finish(paths, KILLED, signal=sup.term_signal, signal_name=signal_name(sup.term_signal))
    try:
        sup.start_workload()
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        sup.fail_to_start(exc)
        raise OperationFailed(str(exc), code="exec_failed")
    try:
        sup.loop(wakeup)
        grace_s = sup.grace() if sup.term_signal is not None else min(sup.grace(), LEFTOVER_GRACE_S)
        sup.end_everything(grace_s, wakeup)
        sup.reap()
        if sup.workload_status is None and sup.term_signal is None:
            sup.term_signal = signal.SIGTERM
    except Exception:
        traceback.print_exc()
        sup.signal_all(signal.SIGKILL)
        sup.reap()
        finish(paths, FAILED, error="supervisor crashed: " + traceback.format_exc(limit=3))
        raise
    return sup.conclude()
