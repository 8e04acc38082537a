"""`launch --queue`, the start of a queued run when its turn comes (`start-queued`), `queue`, and a queued run's
kill: the agent's side of the container's GPU queue (queuestore.py keeps it, scheduler.py takes its turns).

A launch with --queue starts now, exactly as a launch does, when no run waits in the queue and the GPUs it needs
are free; otherwise its run directory is made as a launch makes it, with state `queued`, and it joins the queue.
Whoever finds runs queued and no keeper running (any agent call: ps, queue, kill, launch, watch) starts one, so
that a queue left by a reboot resumes at the next contact, or at boot where systemd booted the container (bootunit.py:
the unit is written when a run is queued and whenever a call finds runs queued).
"""
from __future__ import annotations

import os

from dflash_records.answers import LaunchAnswer
from dflash_records.protocol import FAILED, KILLED, LOST, NOT_VERIFIED, QUEUED, RUNNING, STARTING, iso_utc
from dflash_records.queueinfo import QueueAnswer, QueuedRun
from dflash_records.run import RunRecord

from . import bootunit, keeper, queuestore
from .errors import BadInput, OperationFailed
from .launch import LaunchRequest, create_run_locked, start_verified
from .precheck import check_environment, run_check
from .rundir import RunPaths, existing_run, file_lock, launch_lock
from .runstate import load_record, read_run, read_state, update_state
from .scheduler import fits, read_view
from .spawn import agent_entry, entry_env

ERROR_TAIL_LINES = 10


def check_gpu_request(gpus: list | None, gpu_count: int | None) -> None:
    if gpu_count is None:
        return
    if gpus is not None:
        raise BadInput("--gpus and --gpu-count go not together: name the GPUs, or ask for any N", code="bad_usage")
    if gpu_count <= 0:
        raise BadInput("--gpu-count must be at least 1, not {}".format(gpu_count), code="bad_usage")


def _check_against(view, gpus: list | None, gpu_count: int | None) -> None:
    """A request no wait can satisfy is refused at once: more GPUs than the container has, an index it lacks."""
    if gpu_count and view.total is None:
        raise OperationFailed("--gpu-count needs the container's GPUs, and nvidia-smi could not tell them: {}".format(
            view.error), code="no_gpus")
    if view.total is None:
        return
    if gpu_count and gpu_count > len(view.total):
        raise BadInput("--gpu-count {}: this container has {} GPU{}".format(
            gpu_count, len(view.total), "" if len(view.total) == 1 else "s"), code="bad_usage")
    missing = sorted(set(gpus or ()) - set(view.total))
    if missing:
        raise BadInput("--gpus {}: this container has GPUs {}".format(
            ",".join(map(str, missing)), ",".join(map(str, view.total)) or "none"), code="bad_usage")


def launch_or_queue(req: LaunchRequest, *, verify_timeout: float, settle: float, check_argv: list | None = None,
                    check_input: str | None = None) -> LaunchAnswer:
    """Start now when the queue is empty and the GPUs are free, else queue the run (its answer: the queued
    record with its queue_position)."""
    check_gpu_request(req.gpus, req.gpu_count)
    runs_dir = req.paths.runs_dir
    with file_lock(launch_lock(runs_dir)):
        view = read_view(runs_dir)
        _check_against(view, req.gpus, req.gpu_count)
        ahead = queued_entries(runs_dir)
        ok, chosen = fits(req.gpus, req.gpu_count, view)
        if not ahead and ok:
            if req.gpu_count:
                req.gpus = chosen
            create_run_locked(req)
        else:
            queued_at = iso_utc()
            # the row first: a crash before the run directory leaves a row naming no run (stale, dropped by the
            # next turn), never a queued run outside the queue
            queuestore.enqueue(runs_dir, req.paths.run_id, queued_at=queued_at, gpus=req.gpus,
                               gpu_count=req.gpu_count, check_argv=check_argv, check_input=check_input,
                               verify_timeout_s=verify_timeout)
            try:
                create_run_locked(req, state={"state": QUEUED, "queued_at": queued_at})
            except BaseException:
                queuestore.remove(runs_dir, req.paths.run_id)
                raise
    if not ahead and ok:
        return start_verified(req.paths, req.name, keeper_idle=req.keeper_idle, verify_timeout=verify_timeout,
                              settle=settle)
    start_keeper(runs_dir, idle_exit=req.keeper_idle)
    bootunit.install(runs_dir)
    record = load_record(req.paths)
    record["queue_position"] = queued_positions(runs_dir).get(req.paths.run_id)
    return LaunchAnswer(ok=True, run=RunRecord.from_dict(record))


def queued_entries(runs_dir: str) -> list:
    """The queue's entries whose runs are still queued, first in first."""
    found = []
    for entry in queuestore.entries(runs_dir):
        try:
            paths = RunPaths(runs_dir, entry.run_id)
        except BadInput:
            continue
        if paths.exists() and read_state(paths).get("state") == QUEUED:
            found.append(entry)
    return found


def queued_positions(runs_dir: str) -> dict:
    """run id -> its place in the queue (1: next to start)."""
    return {entry.run_id: place for place, entry in enumerate(queued_entries(runs_dir), 1)}


class QueuePlaces:
    """A queued run's record gets its place in the queue (`queue_position`), as ps and watch send it; the queue is
    read once, when the first queued run asks."""

    def __init__(self, runs_dir: str) -> None:
        self.runs_dir = runs_dir
        self.places: dict | None = None

    def add_to(self, run_id: str, record: dict) -> dict:
        if record.get("state") == QUEUED:
            if self.places is None:
                self.places = queued_positions(self.runs_dir)
            record["queue_position"] = self.places.get(run_id)
        return record


def start_keeper(runs_dir: str, *, idle_exit: float | None = None) -> None:
    entry, pythonpath = agent_entry()
    keeper.ensure_keeper(runs_dir, entry=entry, env=entry_env(os.environ, pythonpath), idle_exit=idle_exit)


def resume(runs_dir: str) -> bool:
    """Runs wait in the queue and no keeper takes its turns (the container rebooted, say): start one, and keep
    the boot unit naming this agent. False when nothing waits."""
    if not queuestore.has_entries(runs_dir):
        return False
    bootunit.install(runs_dir)
    if not keeper.keeper_running(keeper.KeeperPaths(runs_dir)):
        start_keeper(runs_dir)
    return True


def resume_at_boot(runs_dir: str) -> dict:
    """`resume`, the boot unit's command: the queue's keeper started where runs wait, else the unit removed."""
    if os.path.isdir(runs_dir) and resume(runs_dir):
        return {"ok": True, "resumed": True}
    bootunit.remove(runs_dir)
    return {"ok": True, "resumed": False}


def start_queued(runs_dir: str, run_id: str, *, check_argv: list | None, check_input: str | None,
                 verify_timeout: float, spawned: bool = False) -> LaunchAnswer:
    """A run that left the queue (`starting`): its check again, then its start as launch does it, verified (where
    it has no check, the keeper started its supervisor at once: `spawned`). A start that fails ends it `failed`
    with why and its log's last lines (one not verified in time runs on)."""
    paths = existing_run(runs_dir, run_id)
    run = read_run(paths)
    try:
        if check_argv:
            stdin = b""
            if check_input:
                with open(os.path.join(paths.dir, check_input), "rb") as handle:
                    stdin = handle.read()
            run_check(check_argv, env=check_environment(run.get("env") or {}, run.get("pythonpath") or [],
                                                        run.get("gpus")), stdin=stdin)
        settle = run.get("settle_s")
        return start_verified(paths, run.get("name") or run_id, keeper_idle=None, verify_timeout=verify_timeout,
                              settle=float(settle) if isinstance(settle, (int, float)) else 1.0, spawned=spawned)
    except OperationFailed as exc:
        if exc.code != NOT_VERIFIED:
            end_failed(paths, _failure_text(exc))
        raise
    except OSError as exc:
        end_failed(paths, "its start failed: {}".format(exc))
        raise


def _failure_text(exc: OperationFailed) -> str:
    if exc.code == "check_failed":
        check = exc.details.get("check") or {}
        lines = ((check.get("stderr") or "") + (check.get("stdout") or "")).splitlines()
        why = "its check failed when its turn came (exit {})".format(check.get("exit_code"))
    else:
        lines = list(exc.details.get("log_tail") or [])
        why = "its start failed: {}".format(exc)
    tail = lines[-ERROR_TAIL_LINES:]
    return why + ("; its log ends:\n" + "\n".join(tail) if tail else "")


def end_failed(paths: RunPaths, error: str) -> dict:
    """End a queued run's failed start `failed` with `error` (one that succeeded or was killed stays so)."""
    def mutate(state: dict):
        if state.get("state") not in (STARTING, RUNNING, LOST, FAILED):
            return None
        state.update(state=FAILED, error=error, restart_at=None)
        state["ended_at"] = state.get("ended_at") or iso_utc()
        return state
    return update_state(paths, mutate)


def kill_queued(paths: RunPaths) -> bool:
    """A run still queued: `killed`, out of the queue, nothing started; False when it is not queued (any more)."""
    killed = []

    def mutate(state: dict):
        if state.get("state") != QUEUED:
            return None
        state.update(state=KILLED, ended_at=iso_utc(), error="killed while queued")
        killed.append(True)
        return state
    with file_lock(launch_lock(paths.runs_dir)):  # no turn of the queue starts it meanwhile
        update_state(paths, mutate)
        if killed:
            queuestore.remove(paths.runs_dir, paths.run_id)
    return bool(killed)


def queue_answer(runs_dir: str) -> QueueAnswer:
    """queue: the GPUs as the queue sees them, and the queued runs in order."""
    resume(runs_dir)
    view = read_view(runs_dir)
    queued = []
    for place, entry in enumerate(queued_entries(runs_dir), 1):
        run = read_run(RunPaths(runs_dir, entry.run_id))
        queued.append(QueuedRun(run_id=entry.run_id, position=place, name=run.get("name"),
                                gpus=None if entry.gpus is None else tuple(entry.gpus), gpu_count=entry.gpu_count,
                                queued_at=entry.queued_at, sweep_id=run.get("sweep_id")))
    total = view.total
    ours = (list(total or ()) if view.ours_all else sorted(view.ours))
    at_boot = bootunit.installed(runs_dir) if queued else bootunit.available()
    return QueueAnswer(ok=True, resumes_at_boot=at_boot, gpus_total=None if total is None else len(total),
                       gpus_free=tuple(view.free),
                       gpus_ours=tuple(ours), gpus_foreign=tuple(sorted(view.foreign)), gpu_error=view.error,
                       queued=tuple(queued))
