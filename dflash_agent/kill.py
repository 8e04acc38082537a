"""`kill`: ask the supervisor to end the run, then make sure nothing of the run is left, whoever ends it."""
from __future__ import annotations

import signal
import time

from dflash_records.answers import KillAnswer, KilledRun, ProcessInfo, Refusal
from dflash_records.protocol import DEFAULT_GRACE_S, KILLED, LOST, QUEUED, STARTING, TERMINAL_STATES, iso_utc
from dflash_records.run import RunRecord

from . import keeper, lineage, procfs, terminate
from .childwatch import signal_name
from .queuelaunch import kill_queued
from .rundir import RunPaths, existing_run, write_json_atomic
from .runstate import (load_record, read_run, read_state, settle_liveness, supervisor_alive, supervisor_check,
                       update_state)

MARGIN_S = 3.0  # the supervisor's own reaction time and its SIGKILL rounds, beyond the grace
SPAWN_WAIT_S = 3.0
STUCK_SUPERVISOR_GRACE_S = 1.0
POLL_S = 0.05


def run_processes(paths: RunPaths, state: dict) -> list:
    """(pid, start) of every live process of the run, each proven ours (identity.py): the supervisor with its
    tree, the workload's session (which finds an `env -i` child the keeper adopted after the supervisor died)
    and the keeper's record of what it inherited (which finds one that also left the session). DFLASH_RUN_ID
    alone proves nothing: anyone can set it."""
    table = procfs.snapshot()
    below_keeper = lineage.members(paths.runs_dir, keeper.KeeperPaths(paths.runs_dir).dir, table)
    pids = set(lineage.run_session(paths, state, table, below_keeper))
    pids.update(pid for (pid, _), run_id in below_keeper.items() if run_id == paths.run_id)
    if supervisor_alive(paths, state):
        sup = state["supervisor_pid"]
        pids.add(sup)
        pids.update(p for p in procfs.descendants(table, sup) if not table[p].is_zombie)
    return [(pid, table[pid].start_time) for pid in sorted(pids) if pid in table]


def end_run_processes(paths: RunPaths, state: dict, grace: float) -> tuple:
    """TERM every live process of the run, KILL what is left after `grace`: (the pids it found, the pids that
    survived even SIGKILL, whether SIGKILL was needed). What `kill` does with what its supervisor left, and what
    a relaunch does with what a lost run left (its supervisor died alone and its workload lives on)."""
    left = run_processes(paths, state)
    if not left:
        return [], [], False
    survived, escalated = terminate.end_processes(left, grace=grace)
    return [pid for pid, _ in left], survived, escalated


def refuse_stranger(paths: RunPaths, state: dict, refused: list, actions: list) -> None:
    """A supervisor pid in state.json that names a live process which is not this run's supervisor: say so,
    and never signal it (run_processes and ask_supervisor only take a proven supervisor)."""
    why = supervisor_check(paths, state)[1]
    if why and not any(entry["pid"] == state.get("supervisor_pid") for entry in refused):
        refused.append({"pid": state.get("supervisor_pid"), "role": "supervisor", "reason": why,
                        "process": procfs.describe(state["supervisor_pid"]) if isinstance(
                            state.get("supervisor_pid"), int) else None})
        actions.append("not signalled: state.json names pid {} as the supervisor, but {}".format(
            state.get("supervisor_pid"), why))


def wait_for_supervisor(paths: RunPaths, notes: list) -> dict:
    """A run still `starting` may be between the keeper and its supervisor: give it a moment."""
    deadline = time.monotonic() + SPAWN_WAIT_S
    state = read_state(paths)
    while state.get("state") == STARTING and not state.get("supervisor_pid") and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = read_state(paths)
    if state.get("state") == STARTING and not state.get("supervisor_pid"):
        keeper.cancel_spawn(paths.runs_dir, paths.run_id)
        state = mark_killed(paths, None, notes, error="killed before its supervisor started")
    return state


def request_grace(paths: RunPaths, grace: float, actions: list) -> bool:
    """Tell the supervisor this kill's grace (kill_request.json); False where the disk has no room for it."""
    try:
        write_json_atomic(paths.kill_request, {"version": 1, "grace_s": grace, "requested_at": iso_utc()})
    except OSError as exc:
        actions.append("could not tell the supervisor the grace ({}): ending the run after {:g}s ourselves".format(
            exc.strerror or exc, grace))
        return False
    return True


def ask_supervisor(paths: RunPaths, state: dict, grace: float, actions: list) -> dict:
    """SIGTERM the (identity-checked) supervisor and wait for it to record the end and exit.

    Signals never wait for free space: where the grace could not be written down, the supervisor waits the
    run's own grace, so once ours is over we SIGKILL the rest of the run ourselves and let it record that."""
    told = request_grace(paths, grace, actions)
    sup = state["supervisor_pid"]
    if terminate.send(sup, state["supervisor_start_time"], signal.SIGTERM):
        actions.append("sent SIGTERM to supervisor {}".format(sup))
    if told:
        return wait_supervisor_gone(paths, grace + MARGIN_S)
    state = wait_supervisor_gone(paths, grace)
    rest = [(pid, start) for pid, start in run_processes(paths, state) if pid != sup]
    killed = [pid for pid, start in rest if terminate.send(pid, start, signal.SIGKILL)]
    if killed:
        actions.append("sent SIGKILL after the grace to {}".format(killed))
    return wait_supervisor_gone(paths, MARGIN_S)


def wait_supervisor_gone(paths: RunPaths, timeout: float) -> dict:
    """The state once the supervisor has exited (having recorded the end, or not), or after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(paths)
        if not supervisor_alive(paths, state) or time.monotonic() >= deadline:
            return state
        time.sleep(POLL_S)


def mark_killed(paths: RunPaths, sig: int | None, notes: list, **extra) -> dict:
    """The supervisor could not record the end: we do. A `lost` run we had to end becomes `killed`.

    Where even the run's reserve is spent and the disk has no room, the processes are gone all the same:
    `notes` says the end is not on disk, and the state comes back as it would have been written."""
    fields = dict(state=KILLED, signal=sig, signal_name=signal_name(sig), ended_at=iso_utc(), **extra)

    def mutate(state: dict):
        if state.get("state") in TERMINAL_STATES and state.get("state") != LOST:
            return None
        state.update(fields)
        return state
    try:
        return update_state(paths, mutate)
    except OSError as exc:
        notes.append("its end could not be recorded in state.json: {}".format(exc))
        return dict(read_state(paths), **fields)


def settle_or_keep(paths: RunPaths, state: dict, notes: list) -> dict:
    try:
        return settle_liveness(paths)[0]
    except OSError as exc:
        notes.append("its end could not be recorded in state.json: {}".format(exc))
        return state


def dequeue(paths: RunPaths) -> bool:
    """A run still queued leaves its queue `killed` (nothing of it starts); whether it was queued."""
    return read_state(paths).get("state") == QUEUED and kill_queued(paths)


def kill_one(paths: RunPaths, grace: float | None, *, dequeued: bool = False) -> KilledRun:
    """`dequeued`: the caller already took it out of its queue (kill_runs does, before it ends any live run)."""
    actions, notes, refused = [], [], []
    run = read_run(paths)
    grace = float(run.get("grace_s", DEFAULT_GRACE_S)) if grace is None else grace
    was_queued = dequeued or dequeue(paths)
    if was_queued:
        actions.append("removed from the queue: nothing was started")
    state = wait_for_supervisor(paths, notes)
    refuse_stranger(paths, state, refused, actions)
    already_ended = (not was_queued and state.get("state") in TERMINAL_STATES
                     and not supervisor_alive(paths, state))
    supervisor_did_it = False
    if not already_ended and supervisor_alive(paths, state):
        state = ask_supervisor(paths, state, grace, actions)
        supervisor_did_it = state.get("state") in TERMINAL_STATES and not supervisor_alive(paths, state)
    # Processes of a lost run never had their grace; after the supervisor's (or a normal end) it is spent.
    had_grace = supervisor_did_it or (already_ended and state.get("state") != LOST)
    left, _, escalated = end_run_processes(paths, state, STUCK_SUPERVISOR_GRACE_S if had_grace else grace)
    if left:
        actions.append("ended {} leftover process(es): {}".format(len(left), left))
        if state.get("state") not in TERMINAL_STATES or state.get("state") == LOST:
            state = mark_killed(paths, signal.SIGKILL if escalated else signal.SIGTERM, notes)
    elif state.get("state") not in TERMINAL_STATES and refused:
        state = settle_or_keep(paths, state, notes)  # nothing of ours was found to end: lost, not killed
    elif state.get("state") not in TERMINAL_STATES:
        state = mark_killed(paths, signal.SIGTERM, notes)
    survivors = [procfs.describe(pid) for pid, _ in run_processes(paths, state)]
    record = load_record(paths)
    if notes:  # not on disk: say how it ended from what we did
        record.update({key: state.get(key) for key in ("state", "signal", "signal_name", "ended_at", "error")})
    run = RunRecord.from_dict(record)
    return KilledRun(run_id=paths.run_id, ok=not survivors, state=run.state, signal=run.signal,
                     exit_code=run.exit_code, already_ended=already_ended and not left, was_queued=was_queued,
                     survivors=tuple(map(ProcessInfo.from_dict, survivors)), actions=tuple(actions),
                     refused=tuple(map(Refusal.from_dict, refused)), run=run,
                     state_error="; ".join(notes) if notes else None)


def kill_runs(runs_dir: str, run_ids: list, *, grace: float | None) -> KillAnswer:
    # Check every id before touching anything: a typo must not leave half of a batch killed.
    targets = [existing_run(runs_dir, run_id) for run_id in run_ids]
    # the queued ones first: a live run's end starts the next queued run, which may be one asked to end too
    dequeued = {paths.run_id for paths in targets if dequeue(paths)}
    results = tuple(kill_one(paths, grace, dequeued=paths.run_id in dequeued) for paths in targets)
    return KillAnswer(ok=all(r.ok for r in results), runs=results)
