"""Which run each process below the keeper came from, even after its supervisor died and it cleared its
environment and left the workload's session.

While a run's supervisor lives, every process of the run stays beneath it (a subreaper: orphans re-parent to
it). Once it dies, its workload and every orphan that comes loose later re-parent to the keeper, the next
subreaper up; nothing else ever does, since the keeper's own children are supervisors only. So every process
beneath the keeper belongs to some run. The keeper walks its tree on every wake-up (a supervisor's death wakes
it at once) and records each process with its run (pid + start time) in `.keeper/lineage.json`; a process it
inherits before it ever saw it (a double fork finished between two walks) goes to the run whose supervisor
died most recently before that process started. `kill` and `cleanup` walk the same tree with that record.
"""
from __future__ import annotations

import os

from . import identity, procfs
from .rundir import RunPaths, list_run_ids, read_json, write_json_atomic
from .runstate import read_state, supervisor_alive

LINEAGE_VERSION = 1


def lineage_path(keeper_dir: str) -> str:
    return os.path.join(keeper_dir, "lineage.json")


def run_states(runs_dir: str) -> dict:
    """run id -> state.json of every run of the runs directory."""
    return {run_id: read_state(RunPaths(runs_dir, run_id)) for run_id in list_run_ids(runs_dir)}


def load_known(keeper_dir: str) -> dict:
    """(pid, start time) -> run id, as the keeper last recorded it."""
    data = read_json(lineage_path(keeper_dir)) or {}
    known = {}
    for entry in data.get("members") or []:
        if isinstance(entry, list) and len(entry) == 3:
            known[(entry[0], entry[1])] = str(entry[2])
    return known


def save_known(keeper_dir: str, known: dict) -> None:
    members = [[pid, start, run_id] for (pid, start), run_id in sorted(known.items())]
    try:
        write_json_atomic(lineage_path(keeper_dir), {"version": LINEAGE_VERSION, "members": members}, mode=0o600)
    except OSError:
        pass  # a full disk: the walk itself still finds what is below the keeper now


def attribute(table: dict, keeper_pid: int, states, known: dict) -> dict:
    """(pid, start time) -> run id for every live process the keeper inherited, with their descendants; the
    supervisors it started, and their trees, are not walked (kill and cleanup find those from state.json).
    `states`: run id -> state.json, or a function that reads them (called only if a process needs them)."""
    states = _Once(states)
    children = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat)
    found = {}
    keeper_cmdline = procfs.read_cmdline(keeper_pid)
    frontier = [(stat, None) for stat in children.get(keeper_pid, [])]
    while frontier:
        stat, run_id = frontier.pop()
        key = (stat.pid, stat.start_time)
        run_id = run_id or known.get(key) or _direct_child_run(stat, table, states, keeper_cmdline)
        if run_id is None:
            continue
        if not stat.is_zombie:
            found[key] = run_id
        frontier.extend((child, run_id) for child in children.get(stat.pid, []))
    return found


class _Once:
    """The run states, read at the first use only: a keeper with nothing inherited reads no state.json."""

    def __init__(self, states) -> None:
        self._source, self._value = states, None if callable(states) else states

    def items(self):
        if self._value is None:
            self._value = self._source()
        return self._value.items()


# what the keeper starts for a run of its own: a supervisor, and the starter of a queued run whose turn came; an
# ended run's leftovers are never these, however soon after its supervisor's death they started
OWN_TREES = frozenset({"supervise", "start-queued"})


def _direct_child_run(stat, table: dict, states: _Once, keeper_cmdline: str) -> str | None:
    """The run of a process the keeper started or inherited and has not recorded yet."""
    cmdline = procfs.read_cmdline(stat.pid)
    words = cmdline.split()
    if (cmdline and cmdline == keeper_cmdline) or (OWN_TREES & set(words) and "--run-id" in words):
        return None  # a supervisor or a queued run's starter (or the keeper's fork about to become one): its own
    for run_id, state in states.items():
        workload = state.get("pid")
        if workload and (stat.pid, stat.start_time) == (workload, state.get("pid_start_time")):
            return run_id
        if workload and stat.sid == workload and _leader_ok(table, workload, state.get("pid_start_time")):
            return run_id
    return _orphaned_by(stat.start_time, table, states)


def _leader_ok(table: dict, sid: int, leader_start: int | None) -> bool:
    leader = table.get(sid)
    return leader_start is not None and (leader is None or leader.start_time == leader_start)


def _orphaned_by(start_time: int, table: dict, states: _Once) -> str | None:
    """The run whose supervisor, now dead, started last before `start_time`: only a dead supervisor's run
    hands processes to the keeper."""
    best = None
    for run_id, state in states.items():
        sup, sup_start = state.get("supervisor_pid"), state.get("supervisor_start_time")
        if not sup or sup_start is None or sup_start > start_time:
            continue
        alive = table.get(sup)
        if alive is not None and alive.start_time == sup_start and not alive.is_zombie:
            continue
        if best is None or sup_start > best[0]:
            best = (sup_start, run_id)
    return best[1] if best else None


def keeper_pid(runs_dir: str, keeper_dir: str, table: dict) -> int | None:
    """The pid of the live keeper of `runs_dir`, proven so (identity.py), or None."""
    info = read_json(os.path.join(keeper_dir, "keeper.json")) or {}
    pid = info.get("pid")
    keeper = table.get(pid) if isinstance(pid, int) else None
    if keeper is None or keeper.start_time != info.get("start_time") or keeper.is_zombie:
        return None
    if identity.not_ours(pid, info.get("start_time"), identity.KEEPER, runs_dir) is not None:
        return None
    return pid


def members(runs_dir: str, keeper_dir: str, table: dict) -> dict:
    """(pid, start time) -> run id below the live keeper of `runs_dir`; empty when no keeper of ours runs."""
    pid = keeper_pid(runs_dir, keeper_dir, table)
    if pid is None:
        return {}
    return attribute(table, pid, lambda: run_states(runs_dir), load_known(keeper_dir))


def run_session(paths: RunPaths, state: dict, table: dict, below_keeper: dict) -> list:
    """Live processes of the session the run's workload leads (state.json's pid + start time, written by the
    supervisor), in our PID namespace. While the leader lives it must be proven the workload first: a child of
    the run's live supervisor, an orphan the keeper recorded for the run, or, with neither left to ask, a
    process started as this run's workload (the supervisor set DFLASH_RUN_ID and DFLASH_RUNS_DIR for it;
    alone that proves nothing, beside the record it catches a record that names a stranger)."""
    sid, start = state.get("pid"), state.get("pid_start_time")
    leader = table.get(sid) if isinstance(sid, int) else None
    if leader is not None and not leader.is_zombie and leader.start_time == start:
        if not _proven_workload(paths, state, leader, below_keeper):
            return []
    return [pid for pid in procfs.session_members(table, sid, start) if procfs.in_our_pid_namespace(pid)]


def _proven_workload(paths: RunPaths, state: dict, leader, below_keeper: dict) -> bool:
    if supervisor_alive(paths, state):
        return leader.ppid == state.get("supervisor_pid")
    if below_keeper.get((leader.pid, leader.start_time)) == paths.run_id:
        return True
    env = procfs.read_environ(leader.pid) or {}
    return env.get("DFLASH_RUN_ID") == paths.run_id and env.get("DFLASH_RUNS_DIR") == paths.runs_dir
