"""The queue's turn: which queued runs start now, and the start of one (what launch does, verified alike).

The keeper takes a turn whenever it wakes (a supervisor or a starter exited: SIGCHLD; a launch queued a run:
SIGUSR1; its poll). Under the launch lock, so that no launch takes the same GPUs meanwhile, it walks the queue
first in first: the head starts when the GPUs it needs are free, and the runs behind it wait for it (strictly
first in, first out: a wide run is never starved by narrow ones queued after it). A run that starts leaves the
queue as `starting` (its GPUs chosen, where it asked for any N, written into run.json) and a starter process
(`start-queued`) runs its check again and starts it as launch does, verified; a start that fails ends the run
`failed` with why and its log's last lines.

A GPU is free when no live run of ours holds it (a live run without --gpus holds every one) and nvidia-smi does
not show it holding memory that no live run accounts for (a process no run owns: dflash_records/gpu.py).
"""
from __future__ import annotations

import json
import os
import time

from dflash_records.gpu import held_without_run
from dflash_records.protocol import QUEUED, STARTING, iso_utc

from . import gpus as gpu_query
from . import queuestore
from .errors import AgentError
from .rundir import RunPaths, file_lock, launch_lock, write_json_atomic
from .runstate import live_gpu_sets, read_run, read_state, update_state

class GpuView:
    """The container's GPUs as a turn sees them: every index (None: unknown, nvidia-smi could not be read or was
    not asked), those live runs of ours hold (`ours_all`: one holds every GPU), those a process no run owns
    holds."""

    def __init__(self, total: list | None, ours: set, ours_all: bool = False, foreign: set = frozenset(),
                 error: str | None = None) -> None:
        self.total = None if total is None else sorted(total)
        self.ours = set(ours)
        self.ours_all = ours_all
        self.foreign = set(foreign)
        self.error = error

    @property
    def free(self) -> list:
        if self.total is None or self.ours_all:
            return []
        return [index for index in self.total if index not in self.ours and index not in self.foreign]

    def taking(self, gpus: list | None) -> GpuView:
        """This view once a run holding `gpus` (None: every GPU) has started."""
        if gpus is None:
            return GpuView(self.total, self.ours, True, self.foreign, self.error)
        return GpuView(self.total, self.ours | set(gpus), self.ours_all, self.foreign, self.error)


def fits(gpus: list | None, gpu_count: int | None, view: GpuView) -> tuple:
    """(whether a run asking for `gpus` (None: every GPU; []: none) or any `gpu_count` GPUs may start now, the
    GPUs it gets: the named ones, the lowest free ones, or None for every GPU)."""
    if gpu_count:
        free = view.free
        return (True, free[:gpu_count]) if len(free) >= gpu_count else (False, None)
    if gpus == []:
        return True, []
    if gpus is None:
        return not (view.ours or view.ours_all or view.foreign), None
    return not (view.ours_all or set(gpus) & (view.ours | view.foreign)), list(gpus)


def plan_turn(entries: list, states: dict, view: GpuView) -> tuple:
    """(the entries that start now, each with its GPUs, first in first; the entries no longer queued, whose rows
    are stale). Strictly first in, first out: the first queued entry that does not fit stops the turn."""
    starts, stale = [], []
    for entry in entries:
        if states.get(entry.run_id) != QUEUED:
            stale.append(entry)
            continue
        ok, chosen = fits(entry.gpus, entry.gpu_count, view)
        if not ok:
            break
        starts.append((entry, chosen))
        view = view.taking(chosen)
    return starts, stale


def read_view(runs_dir: str, *, smi: bool = True) -> GpuView:
    """The GPUs now: ours from the live runs' records, the rest from nvidia-smi (unless `smi` is False)."""
    held = tuple(live_gpu_sets(runs_dir))  # None: a run that holds every GPU
    ours = set()
    for gpu_set in held:
        ours.update(gpu_set or ())
    ours_all = any(gpu_set is None for gpu_set in held)
    if not smi:
        return GpuView(None, ours, ours_all)
    result = gpu_query.query_gpus()
    if not result["available"] or result["error"]:
        return GpuView(None, ours, ours_all, error=result["error"] or "nvidia-smi not found")
    rows = result["gpus"]
    foreign = {row.index for row in held_without_run(rows, [s for s in held if s is not None])}
    return GpuView([row.index for row in rows], ours, ours_all, foreign)


def take_turn(runs_dir: str) -> list:
    """Start what may start now: each such run leaves the queue as `starting`; its entry comes back, for the
    caller (the keeper) to start its starter."""
    if not queuestore.has_entries(runs_dir):
        return []
    with file_lock(launch_lock(runs_dir)):
        entries = queuestore.entries(runs_dir)
        states = {entry.run_id: _queued_state(runs_dir, entry.run_id) for entry in entries}
        cheap = read_view(runs_dir, smi=False)
        head = next((e for e in entries if states[e.run_id] == QUEUED), None)
        # nvidia-smi only when what our own runs hold leaves the head a chance
        starts, stale = plan_turn(entries, states, read_view(runs_dir) if _may_fit(head, cheap) else cheap)
        for entry in stale:
            queuestore.remove(runs_dir, entry.run_id)
        started = [entry for entry, chosen in starts if _dequeue(runs_dir, entry, chosen)]
    return started


def _may_fit(head, ours: GpuView) -> bool:
    if head is None:
        return False
    if head.gpu_count:
        return not ours.ours_all
    return fits(head.gpus, None, ours)[0]


def _queued_state(runs_dir: str, run_id: str) -> str | None:
    try:
        paths = RunPaths(runs_dir, run_id)
    except AgentError:  # a row whose run id names no run is stale
        return None
    return read_state(paths).get("state") if paths.exists() else None


def _dequeue(runs_dir: str, entry, chosen: list | None) -> bool:
    """The run leaves the queue as `starting`: its GPUs in run.json (any N: the ones chosen), then its state,
    then its row (a crash in between leaves a row whose run is no longer queued: stale, removed next turn)."""
    paths = RunPaths(runs_dir, entry.run_id)
    if entry.gpu_count:
        run = read_run(paths)
        run["gpus"] = chosen
        write_json_atomic(paths.run_json, run)

    def mutate(state: dict):
        if state.get("state") != QUEUED:
            return None
        state.update(state=STARTING, dequeued_ts=time.time(), dequeued_at=iso_utc())
        return state
    moved = update_state(paths, mutate).get("state") == STARTING
    queuestore.remove(runs_dir, entry.run_id)
    return moved


def starter_argv(entry, runs_dir: str, *, spawned: bool = False) -> list:
    """The arguments of `start-queued` for an entry that left the queue (`spawned`: its supervisor is started)."""
    argv = ["start-queued", "--runs-dir", os.path.abspath(runs_dir), "--run-id", entry.run_id]
    if spawned:
        argv.append("--spawned")
    if entry.check_argv:
        argv += ["--check", json.dumps(entry.check_argv)]
    if entry.check_input:
        argv += ["--check-input", entry.check_input]
    if entry.verify_timeout_s is not None:
        argv += ["--verify-timeout", "{:g}".format(entry.verify_timeout_s)]
    return argv
