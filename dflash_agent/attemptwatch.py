"""What the supervisor watches while an attempt runs: its log (the hang watchdog, hangwatch.py) and, on a job's
node, torchrun's restarts of the workers (workerrestarts.py); and what it does about them: the stacks of a hung
attempt dumped into the log, a job node's hung workers ended, a crash loop of restarted workers stopped.

A watcher is a helper of the run, never its end: an error of its own (a bug, a log it cannot parse) is logged, the
traceback in the supervisor's log and one line in the run's, and the watchers rest until the next attempt while
the run goes on. A part of Supervisor (supervisor.py), which holds the run's processes and records.
"""
from __future__ import annotations

import os
import signal
import time
import traceback

from dflash_records.protocol import iso_utc
from dflash_records.restart import CRASH_LOOP, CRASH_LOOP_ATTEMPTS, HUNG, crash_loop

from . import procfs, terminate, workerrestarts
from .hangwatch import AttemptLog
from .runstate import update_state

# How long the workload's stack dump (SIGUSR1 to the processes that handle it) may take before the hung
# attempt is ended: the log stops growing sooner.
STACK_DUMP_WAIT_S = 5.0
STACK_DUMP_QUIET_S = 0.5


def new_attempt(number: int) -> dict:
    """An attempt's record (state.json's attempts[]) as it starts."""
    return {"attempt": number, "started_at": iso_utc(), "ended_at": None, "exit_code": None, "signal": None,
            "signal_name": None, "reason": None, "last_step": None, "exception": None}


class AttemptWatch:
    """The watchers of Supervisor's current attempt (it sets paths, run, attempts, hang_setting, term_signal and
    provides run_processes, reap and grace)."""

    attempt_log: AttemptLog | None = None
    watching = True        # off after a watcher's own error, until the next attempt
    worker_restarts_seen = 0  # a job node: torchrun's restarts of its workers counted so far
    crash_line = None

    def watch_from(self, offset: int) -> None:
        """Follow the log from `offset` for a new attempt, every watcher on again."""
        self.attempt_log = AttemptLog(self.paths.log, offset)
        self.watching = True

    def look(self, wakeup) -> str | None:
        """The watchers' look at the running attempt: CRASH_LOOP, HUNG, or None while it may go on."""
        if not self.watching:
            return None
        try:
            return self._look(time.monotonic(), wakeup)
        except Exception as exc:  # noqa: BLE001 - a watcher's bug must not end the run it watches
            self.watcher_failed(exc)
            return None

    def read_log(self) -> None:
        """Bring the attempt's log reading up to date (its last step and exception), unless the watchers rest."""
        if self.watching:
            try:
                self.attempt_log.poll(time.monotonic())
            except Exception as exc:  # noqa: BLE001
                self.watcher_failed(exc)

    def watcher_failed(self, exc: Exception) -> None:
        traceback.print_exc()  # the supervisor's stderr is its log
        self.watching = False
        self.say("the supervisor's watchers failed ({}: {}); the hang watchdog is off until the next attempt, the "
                 "run goes on".format(type(exc).__name__, str(exc)[:200]))

    def _look(self, now: float, wakeup) -> str | None:
        self.attempt_log.poll(now)
        if self.run.get("worker_restarts") and self.follow_worker_restarts():
            return CRASH_LOOP
        silent = self.attempt_log.hung(now, self.hang_setting)
        if silent is None:
            return None
        catching = self.dump_stacks(silent, wakeup)
        if not self.run.get("worker_restarts") or not catching:
            return HUNG
        self.end_workers(catching)
        return None

    def follow_worker_restarts(self) -> bool:
        """A job node: each restart of its workers by torchrun ends one attempt and begins the next
        (workerrestarts); True once the restarts repeat one failure without progress (a crash loop)."""
        count = workerrestarts.restart_count(pid for pid, _ in self.run_processes())
        if count is None or count <= self.worker_restarts_seen:
            return False
        for _ in range(count - self.worker_restarts_seen):
            self.attempt_log.poll(time.monotonic())
            self.attempts[-1].update(ended_at=iso_utc(), reason=workerrestarts.WORKERS_RESTARTED,
                                     last_step=self.attempt_log.last_step, exception=self.attempt_log.exception)
            self.attempts.append(new_attempt(len(self.attempts) + 1))
            self.watch_from(os.path.getsize(self.paths.log))
        self.worker_restarts_seen = count
        self.say("torchrun restarted the job's workers: attempt {}/{}".format(
            len(self.attempts), workerrestarts.max_attempts(self.run)))
        update_state(self.paths, lambda state: dict(state, attempt=len(self.attempts), attempts=self.attempts))
        self.crash_line = crash_loop(self.attempts[:-1])
        if self.crash_line is not None:
            self.say("crash loop: the job's workers failed the same way {} times in a row with no step progress: "
                     "{}; no more restarts".format(CRASH_LOOP_ATTEMPTS, self.crash_line))
        return self.crash_line is not None

    def end_workers(self, workers: list) -> None:
        """A job node's hang: end its trainer processes only (TERM, the grace, KILL). torchrun, which stays,
        sees its workers fail and restarts the workers of every node of the job together."""
        self.say("ending the hung workers {}; torchrun restarts the job's workers on every node".format(
            ", ".join(str(pid) for pid, _ in workers)))
        terminate.end_processes(workers, grace=self.grace(), tick=self.reap)
        self.watch_from(os.path.getsize(self.paths.log))

    def say(self, text: str) -> None:
        """A line of the supervisor's own in the run's log, where its reader looks for why."""
        try:
            with open(self.paths.log, "a") as log:
                log.write("dflash: {}\n".format(text))
        except OSError:
            pass

    def dump_stacks(self, silent: float, wakeup) -> list:
        """SIGUSR1 to every process of the run that handles it (the bundled trainer's faulthandler writes every
        thread's stack to the log); a process without a handler would die of it and is left alone. Those that
        handle it, as (pid, start time)."""
        catching = [(pid, start) for pid, start in self.run_processes()
                    if procfs.catches_signal(pid, signal.SIGUSR1)]
        self.say("no step for {:.0f}s (bound {:.0f}s): judged hung; {}".format(
            silent, self.attempt_log.bound(self.hang_setting),
            "Python stacks of pid {} follow".format(", ".join(str(pid) for pid, _ in catching)) if catching
            else "no process of the run dumps its stacks on SIGUSR1"))
        for pid, start in catching:
            terminate.send(pid, start, signal.SIGUSR1)
        if catching:
            self.wait_log_quiet(wakeup)
        return catching

    def wait_log_quiet(self, wakeup) -> None:
        deadline, size, quiet_since = time.monotonic() + STACK_DUMP_WAIT_S, -1, time.monotonic()
        while time.monotonic() < deadline and self.term_signal is None:
            now_size = os.path.getsize(self.paths.log) if os.path.exists(self.paths.log) else 0
            if now_size != size:
                size, quiet_since = now_size, time.monotonic()
            elif time.monotonic() - quiet_since >= STACK_DUMP_QUIET_S:
                return
            wakeup.wait(0.1)
