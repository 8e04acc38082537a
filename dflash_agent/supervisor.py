"""The supervisor of one run: starts the workload, reaps everything, records how it ended, and on SIGTERM
ends every process of the run (TERM, grace, KILL) before it writes the terminal state.

Under a restart policy (dflash_records/restart.py) it starts the workload again after a failed or hung attempt, after a
backoff, and records every attempt in state.json; its hang watchdog (hangwatch.py, attemptwatch.py) ends an
attempt that went silent, once the Python stacks of its processes are in the log. All of it here, inside the container: a run
heals itself with no controller connected.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback

from dflash_records.protocol import DEFAULT_GRACE_S, FAILED, KILLED, RUNNING, STARTING, SUCCEEDED, iso_utc
from dflash_records.restart import (BACKOFF_BASE_S, BACKOFF_KILLED, CRASH_LOOP, CRASH_LOOP_ATTEMPTS, EXITED,
                                    FAILED_EXIT, HUNG, attempt_end, backoff, crash_loop, max_attempts, policy_text,
                                    should_restart)

from . import procfs, workerrestarts
from .attemptwatch import AttemptWatch, new_attempt
from .childwatch import Wakeup, decode_status, ignore_signal, reap_children, set_child_subreaper, signal_name
from .errors import OperationFailed
from .rundir import RunPaths, disk_full, existing_run, read_json, write_json_atomic
from .runstate import DISK_FULL, finish, read_run, update_state

LEFTOVER_GRACE_S = 5.0
POLL_S = 0.1
KILL_ROUNDS = 100
KILL_PAUSE_S = 0.05
# Once the workload has exited by itself, the longest the supervisor spends ending what it left behind (their
# grace, then every KILL round) before it records how the run ended; a launch waits that long for the record.
LEFTOVERS_LIMIT_S = LEFTOVER_GRACE_S + KILL_ROUNDS * KILL_PAUSE_S
WATCH_TICK_S = 1.0


class Supervisor(AttemptWatch):
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
        self.policy = self.run.get("restart") or {}
        hang = self.run.get("hang_timeout_s")
        self.hang_setting = float(hang) if isinstance(hang, (int, float)) else None
        self.attempts = []
        settle = self.run.get("settle_s")
        # a first attempt that ends sooner did not start: no restart (the launch reports it failed)
        self.settle_s = float(settle) if isinstance(settle, (int, float)) else 0.0
        self.started_at = None  # time.monotonic() of the attempt's start

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

    def command(self) -> list:
        """The run's command; from the second attempt on (and on the first of a relaunched lost run) with the
        run's retry arguments (the bundled trainer's `--resume auto`: it goes on from its newest complete
        checkpoint whatever its config says)."""
        resumes = self.attempts or self.run.get("relaunch_of")  # a relaunched lost run resumes from its first
        extra = self.run.get("retry_args") or [] if resumes else []
        return list(self.run["command"]) + list(extra)

    def start_workload(self) -> bool:
        """Start the next attempt; False when a kill came first (checked last thing before the start)."""
        command, env = self.command(), self.workload_env()
        log_fd = os.open(self.paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            offset = os.fstat(log_fd).st_size
            if self.term_signal is not None:
                return False
            proc = subprocess.Popen(command, cwd=self.run.get("cwd") or "/", env=env,
                                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, restore_signals=True)
        finally:
            os.close(log_fd)
        self.workload_pid = proc.pid
        self.workload_pgid = proc.pid  # start_new_session: the workload leads its own session and group
        self._popen = proc  # keep it referenced; we reap it ourselves with waitpid(-1)
        pid_start = procfs.start_time(proc.pid)
        self.workload_status = None
        self.started_at = time.monotonic()
        self.watch_from(offset)
        self.attempts.append(new_attempt(len(self.attempts) + 1))

        def mutate(state: dict):
            state.update(state=RUNNING, pid=proc.pid, pgid=proc.pid, pid_start_time=pid_start, restart_at=None,
                         attempt=len(self.attempts),
                         max_attempts=workerrestarts.max_attempts(self.run) or max_attempts(self.policy),
                         restart_policy=policy_text(self.policy), attempts=self.attempts)
            state.setdefault("started_at", None)
            state["started_at"] = state["started_at"] or iso_utc()
            return state
        update_state(self.paths, mutate)
        return True

    def fail_to_start(self, exc: Exception) -> dict:
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
        return finish(self.paths, FAILED, exit_code=code, signal=None, error=reason, restart_at=None)

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
        return [(stat.pid, stat.start_time) for stat in self.run_stats()]

    def run_stats(self) -> list:
        """run_processes' /proc entries (ProcStat), pid order."""
        table = procfs.snapshot()
        pids = {p for p in procfs.descendants(table, self.pid) if not table[p].is_zombie}
        pids.discard(self.pid)
        return [table[pid] for pid in sorted(pids) if pid in table]

    def signal_all(self, sig: int) -> None:
        # Once the workload is reaped its pgid may be reused by a stranger; its group's members are our
        # descendants anyway (we are their subreaper), so the walk below still reaches them.
        grouped = False
        if self.workload_pgid and self.workload_status is None:
            try:
                os.killpg(self.workload_pgid, sig)
                grouped = True
            except OSError:
                pass
        for stat in self.run_stats():
            if grouped and stat.pgid == self.workload_pgid:
                # the group's signal reached it: a second SIGTERM landing while it exits on the first kills it
                # (a workload that exits 0 on SIGTERM was recorded with no exit code)
                continue
            if procfs.is_alive(stat.pid, stat.start_time):
                try:
                    os.kill(stat.pid, sig)
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

    def loop(self, wakeup: Wakeup) -> str:
        """Wait for the attempt to end: EXITED, KILLED (SIGTERM came) or HUNG (the watchdog's call)."""
        tick = WATCH_TICK_S if not self.hang_setting else min(WATCH_TICK_S, max(self.hang_setting / 4, 0.05))
        while self.workload_status is None and self.term_signal is None:
            self.reap()
            if self.workload_status is not None or self.term_signal is not None:
                break
            verdict = self.look(wakeup)
            if verdict is not None:
                return verdict
            wakeup.wait(tick)
        return KILLED if self.term_signal is not None else EXITED

    def end_attempt(self, why: str) -> dict:
        """Record how the attempt ended (state.json's attempts[]) and return that record."""
        exit_code, sig = decode_status(self.workload_status) if self.workload_status is not None else (None, None)
        self.read_log()
        reason = why if why != EXITED else (EXITED if exit_code == 0 else FAILED_EXIT)
        attempt = self.attempts[-1]
        attempt.update(ended_at=iso_utc(), exit_code=exit_code, signal=sig, signal_name=signal_name(sig),
                       reason=reason, last_step=self.attempt_log.last_step, exception=self.attempt_log.exception)
        update_state(self.paths, lambda state: dict(state, attempts=self.attempts))
        return attempt

    def back_off(self, wakeup: Wakeup) -> bool:
        """Wait before the next attempt; False when a kill came meanwhile (then nothing starts again)."""
        base = self.run.get("restart_backoff_s")
        delay = backoff(len(self.attempts), base=float(base) if isinstance(base, (int, float)) else BACKOFF_BASE_S)
        last = self.attempts[-1]
        self.say("attempt {}/{} {}; restarting in {:g}s".format(
            last["attempt"], max_attempts(self.policy), attempt_end(last), delay))
        until = time.time() + delay

        def mutate(state: dict):
            state.update(pid=None, pgid=None, pid_start_time=None,
                         restart_at=iso_utc(until))
            return state
        update_state(self.paths, mutate)
        deadline = time.monotonic() + delay
        while self.term_signal is None and time.monotonic() < deadline:
            self.reap()
            wakeup.wait(min(WATCH_TICK_S, max(deadline - time.monotonic(), 0.0)))
        return self.term_signal is None

    def conclude(self, why: str | None = None) -> dict:
        exit_code, sig = decode_status(self.workload_status) if self.workload_status is not None else (None, None)
        # a full disk is most likely why it ended (its log could not be written): say so beside the exit code
        why_fields = {"error": DISK_FULL} if disk_full(self.paths.dir) else {}
        if why == HUNG:
            why_fields = dict(why_fields, reason=HUNG)
            why_fields.setdefault("error", "hung: no step for longer than its bound")
        fields = dict(restart_at=None, **why_fields)
        if self.term_signal is not None:
            sig = sig if sig is not None else signal.SIGTERM
            return finish(self.paths, KILLED, exit_code=exit_code, signal=sig, signal_name=signal_name(sig), **fields)
        if exit_code == 0 and why != HUNG:  # a hung workload may well exit 0 on the watchdog's SIGTERM
            return finish(self.paths, SUCCEEDED, exit_code=0, signal=None, **fields)
        return finish(self.paths, FAILED, exit_code=exit_code, signal=sig, signal_name=signal_name(sig), **fields)

    def killed_in_backoff(self) -> dict:
        """A kill between two attempts: no workload to end, no signal to record; the log says it."""
        why = "{} (attempt {}/{} was next)".format(BACKOFF_KILLED, len(self.attempts) + 1, max_attempts(self.policy))
        self.say(why)
        return finish(self.paths, KILLED, exit_code=None, signal=None, signal_name=None, reason=BACKOFF_KILLED,
                      error=why, restart_at=None)

    def last_attempt(self, why: str, attempt: dict, lasted: float) -> dict | None:
        """The run's terminal state when the attempt that just ended is its last; None when another starts."""
        if why == CRASH_LOOP and self.term_signal is None:  # a job node's workers (follow_worker_restarts)
            return finish(self.paths, FAILED, exit_code=attempt["exit_code"], signal=attempt["signal"],
                          signal_name=attempt["signal_name"], reason=CRASH_LOOP, restart_at=None,
                          error="crash loop: " + self.crash_line)
        if self.term_signal is not None or attempt["reason"] == EXITED:
            return self.conclude()
        looping = crash_loop(self.attempts)
        if looping is not None:
            self.say("crash loop: the same failure {} attempts in a row with no step progress: {}; no more "
                     "restarts".format(CRASH_LOOP_ATTEMPTS, looping))
            exit_code, sig = attempt["exit_code"], attempt["signal"]
            return finish(self.paths, FAILED, exit_code=exit_code, signal=sig, signal_name=signal_name(sig),
                          reason=CRASH_LOOP, restart_at=None, error="crash loop: " + looping)
        if not should_restart(self.policy, self.attempts):
            return self.conclude(why)
        if len(self.attempts) == 1 and lasted < self.settle_s:
            # died while its launch still waited for it to settle (a typo): failed as without a policy
            self.say("attempt 1 {} {:.1f}s after its start, before its launch saw it settle: not restarted".format(
                attempt_end(attempt), lasted))
            return self.conclude(why)
        return None

    def run_attempts(self, wakeup: Wakeup) -> dict:
        """Attempt after attempt under the restart policy, until one succeeds, a kill comes, the restarts are
        used up or the same failure repeats (a crash loop); the run's terminal state."""
        while True:
            why = self.loop(wakeup)
            lasted = time.monotonic() - self.started_at
            grace_s = self.grace() if why != EXITED else min(self.grace(), LEFTOVER_GRACE_S)
            self.end_everything(grace_s, wakeup)
            self.reap()
            if self.workload_status is None and self.term_signal is None and why not in (HUNG, CRASH_LOOP):
                self.term_signal = signal.SIGTERM
            ended = self.last_attempt(why, self.end_attempt(why), lasted)
            if ended is not None:
                return ended
            if not self.back_off(wakeup):
                return self.killed_in_backoff()
            try:
                if not self.start_workload():
                    return self.killed_in_backoff()
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return self.fail_to_start(exc)


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
        if not sup.start_workload():  # killed between the check above and the start
            return finish(paths, KILLED, signal=sup.term_signal, signal_name=signal_name(sup.term_signal))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        sup.fail_to_start(exc)
        raise OperationFailed(str(exc), code="exec_failed")
    try:
        return sup.run_attempts(wakeup)
    except Exception:
        traceback.print_exc()
        sup.signal_all(signal.SIGKILL)
        sup.reap()
        finish(paths, FAILED, error="supervisor crashed: " + traceback.format_exc(limit=3))
        raise
