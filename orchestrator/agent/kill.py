"""`kill`: ask the supervisor to end the run, then make sure nothing of the run is left, whoever ends it."""
from __future__ import annotations

import signal
import time

from . import keeper, lineage, procfs, terminate
from .childwatch import signal_name
from .protocol import DEFAULT_GRACE_S, KILLED, LOST, STARTING, TERMINAL_STATES
from .rundir import RunPaths, existing_run, utc_now_iso, write_json_atomic
from .runstate import finish, load_record, read_run, read_state, supervisor_alive, update_state

MARGIN_S = 3.0  # the supervisor's own reaction time and its SIGKILL rounds, beyond the grace
SPAWN_WAIT_S = 3.0
STUCK_SUPERVISOR_GRACE_S = 1.0
POLL_S = 0.05


def run_processes(paths: RunPaths, state: dict) -> list:
    """(pid, start) of every live process of the run: by DFLASH_RUN_ID, by the workload's session (which
    finds an `env -i` child the keeper adopted after the supervisor died), by the keeper's record of what it
    inherited (which finds one that also left the session), and the supervisor with its tree."""
    table = procfs.snapshot()
    pids = set(procfs.session_members(table, state.get("pid"), state.get("pid_start_time")))
    below_keeper = lineage.members(paths.runs_dir, keeper.KeeperPaths(paths.runs_dir).dir, table)
    pids.update(pid for (pid, _), run_id in below_keeper.items() if run_id == paths.run_id)
    for pid, (value, env) in procfs.processes_with_env("DFLASH_RUN_ID", table).items():
        if value == paths.run_id and env.get("DFLASH_RUNS_DIR", paths.runs_dir) == paths.runs_dir:
            pids.add(pid)
    if supervisor_alive(state):
        sup = state["supervisor_pid"]
        pids.add(sup)
        pids.update(p for p in procfs.descendants(table, sup) if not table[p].is_zombie)
    return [(pid, table[pid].start_time) for pid in sorted(pids) if pid in table]


def wait_for_supervisor(paths: RunPaths) -> dict:
    """A run still `starting` may be between the keeper and its supervisor: give it a moment."""
    deadline = time.monotonic() + SPAWN_WAIT_S
    state = read_state(paths)
    while state.get("state") == STARTING and not state.get("supervisor_pid") and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = read_state(paths)
    if state.get("state") == STARTING and not state.get("supervisor_pid"):
        keeper.cancel_spawn(paths.runs_dir, paths.run_id)
        state = finish(paths, KILLED, signal=None, error="killed before its supervisor started")
    return state


def ask_supervisor(paths: RunPaths, state: dict, grace: float, actions: list) -> dict:
    """SIGTERM the (identity-checked) supervisor and wait for its terminal state and its exit."""
    write_json_atomic(paths.kill_request, {"version": 1, "grace_s": grace, "requested_at": utc_now_iso()})
    if terminate.send(state["supervisor_pid"], state["supervisor_start_time"], signal.SIGTERM):
        actions.append("sent SIGTERM to supervisor {}".format(state["supervisor_pid"]))
    deadline = time.monotonic() + grace + MARGIN_S
    while time.monotonic() < deadline:
        state = read_state(paths)
        if state.get("state") in TERMINAL_STATES and not supervisor_alive(state):
            break
        time.sleep(POLL_S)
    return state


def mark_killed(paths: RunPaths, sig: int) -> dict:
    """The supervisor could not record the end: we do. A `lost` run we had to end becomes `killed`."""
    def mutate(state: dict):
        if state.get("state") in TERMINAL_STATES and state.get("state") != LOST:
            return None
        state.update(state=KILLED, signal=sig, signal_name=signal_name(sig), ended_at=utc_now_iso())
        return state
    return update_state(paths, mutate)


def kill_one(paths: RunPaths, grace: float | None) -> dict:
    actions = []
    run = read_run(paths)
    grace = float(run.get("grace_s", DEFAULT_GRACE_S)) if grace is None else grace
    state = wait_for_supervisor(paths)
    already_ended = state.get("state") in TERMINAL_STATES and not supervisor_alive(state)
    supervisor_did_it = False
    if not already_ended and supervisor_alive(state):
        state = ask_supervisor(paths, state, grace, actions)
        supervisor_did_it = state.get("state") in TERMINAL_STATES and not supervisor_alive(state)
    left = run_processes(paths, state)
    if left:
        actions.append("ending {} leftover process(es): {}".format(len(left), [pid for pid, _ in left]))
        # Processes of a lost run never had their grace; after the supervisor's (or a normal end) it is spent.
        had_grace = supervisor_did_it or (already_ended and state.get("state") != LOST)
        wait = STUCK_SUPERVISOR_GRACE_S if had_grace else grace
        _, escalated = terminate.end_processes(left, grace=wait)
        if state.get("state") not in TERMINAL_STATES or state.get("state") == LOST:
            state = mark_killed(paths, signal.SIGKILL if escalated else signal.SIGTERM)
    elif state.get("state") not in TERMINAL_STATES:
        state = mark_killed(paths, signal.SIGTERM)
    survivors = [procfs.describe(pid) for pid, _ in run_processes(paths, read_state(paths))]
    record = load_record(paths)
    return {"run_id": paths.run_id, "ok": not survivors, "state": record["state"], "signal": record.get("signal"),
            "exit_code": record.get("exit_code"), "already_ended": already_ended and not left,
            "survivors": survivors, "actions": actions, "run": record}


def kill_runs(runs_dir: str, run_ids: list, *, grace: float | None) -> dict:
    # Check every id before touching anything: a typo must not leave half of a batch killed.
    targets = [existing_run(runs_dir, run_id) for run_id in run_ids]
    results = [kill_one(paths, grace) for paths in targets]
    return {"ok": all(r["ok"] for r in results), "runs": results}
