"""A run's state machine on disk: reading records, locked transitions, and deciding `lost`."""
from __future__ import annotations

import errno
import time

from dflash_records.protocol import LOST, QUEUED, STARTING, TERMINAL_STATES, iso_utc
from dflash_records.run import RUN_JSON_FIELDS, STATE_JSON_FIELDS

from . import identity, procfs
from .rundir import RunPaths, file_lock, list_run_ids, read_json, release_reserve, write_json_atomic

# A run may sit in `starting` without a supervisor pid while the keeper spawns it; after this it is lost.
SPAWN_DEADLINE_S = 60.0
DISK_FULL = "disk full: no space left for the run's files (its log may end early)"



def read_run(paths: RunPaths) -> dict:
    return read_json(paths.run_json) or {}


def read_state(paths: RunPaths) -> dict:
    return read_json(paths.state_json) or {"state": STARTING}


def update_state(paths: RunPaths, mutate) -> dict:
    """Apply `mutate(state) -> new state | None` under the run's lock; None leaves the file alone."""
    with file_lock(paths.lock):
        current = read_state(paths)
        changed = mutate(dict(current))
        if changed is None:
            return current
        changed["version"] = 1
        changed["run_id"] = paths.run_id
        changed["updated_at"] = iso_utc()
        try:
            write_json_atomic(paths.state_json, changed)
        except OSError as exc:
            # a full disk: spend the run's reserve on this write, the one that says how it ended
            if exc.errno != errno.ENOSPC or not release_reserve(paths.reserve):
                raise
            changed.setdefault("error", None)
            changed["error"] = changed["error"] or DISK_FULL
            write_json_atomic(paths.state_json, changed)
        return changed


def settle_or_note(paths: RunPaths) -> str | None:
    """settle_liveness for readers (ps, watch): a state that cannot be written (a full disk) is no reason
    to hide the run; the reason comes back instead, for the record."""
    try:
        settle_liveness(paths)
    except OSError as exc:
        return "cannot update its state: {}".format(exc)
    return None


def finish(paths: RunPaths, state_name: str, **fields) -> dict:
    """Move a run to a terminal state unless it already has one (every run ends exactly once)."""
    def mutate(state: dict):
        if state.get("state") in TERMINAL_STATES:
            return None
        state["restart_at"] = None  # an ended run waits for no restart, whoever ends it
        state.update(fields)
        state["state"] = state_name
        state.setdefault("ended_at", None)
        state["ended_at"] = state["ended_at"] or iso_utc()
        return state
    return update_state(paths, mutate)


def supervisor_check(paths: RunPaths, state: dict) -> tuple:
    """(the run's supervisor runs, why the live process its record names is not that supervisor).

    state.json is a record, not a proof: the pid it names must still be the process that started at the
    recorded time, and run this run's `supervise` in our namespaces (identity.py). One that is not is never
    taken for the supervisor, and never signalled; the second value says why, for the caller to report."""
    pid = state.get("supervisor_pid")
    if not pid:
        return False, None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False, "state.json names no valid supervisor pid: {!r}".format(pid)
    recorded_boot = state.get("supervisor_boot_id")
    if recorded_boot and recorded_boot != procfs.boot_id():
        return False, None  # from before a reboot: that supervisor is gone, whoever holds its pid now
    start = state.get("supervisor_start_time")
    if not procfs.is_alive(pid, None) or (start is not None and procfs.start_time(pid) != start):
        return False, None  # gone (its pid free, or reused since)
    why = identity.not_ours(pid, start, identity.SUPERVISE, paths.runs_dir, paths.run_id)
    return why is None, why


def supervisor_alive(paths: RunPaths, state: dict) -> bool:
    return supervisor_check(paths, state)[0]


def spawn_pending(run: dict, state: dict) -> bool:
    """Still waiting for the keeper to start the supervisor, and not for too long (since its launch, or since
    it left the queue)."""
    if state.get("state") != STARTING or state.get("supervisor_pid"):
        return False
    since = state.get("dequeued_ts") or run.get("created_ts") or 0
    return time.time() - float(since) < SPAWN_DEADLINE_S


def is_live(paths: RunPaths, run: dict, state: dict) -> bool:
    if state.get("state") in TERMINAL_STATES:
        return False
    return supervisor_alive(paths, state) or spawn_pending(run, state)


def settle_liveness(paths: RunPaths, *, dry_run: bool = False) -> tuple:
    """(state, newly_lost): a non-terminal run whose supervisor is gone is `lost`, and is written so."""
    run, state = read_run(paths), read_state(paths)
    # a queued run has no process to lose: it waits in the queue (queuestore.py), whatever reboots meanwhile
    if state.get("state") in TERMINAL_STATES + (QUEUED,) or is_live(paths, run, state):
        return state, False
    if dry_run:
        return state, True

    def mutate(current: dict):
        # Re-check under the lock: the supervisor may have written its terminal state meanwhile.
        if current.get("state") in TERMINAL_STATES + (QUEUED,) or is_live(paths, run, current):
            return None
        stranger = supervisor_check(paths, current)[1]
        why = "its recorded supervisor is not its supervisor: " + stranger if stranger else \
            "supervisor gone without a terminal state"
        # restart_at=None: a supervisor that died in a backoff starts nothing at that time
        current.update(state=LOST, ended_at=iso_utc(), error=current.get("error") or why, restart_at=None)
        return current
    new_state = update_state(paths, mutate)
    return new_state, new_state.get("state") == LOST and state.get("state") != LOST


def build_record(paths: RunPaths, run: dict, state: dict) -> dict:
    """The run record (dflash_records/run.py) as the wire carries it: a JSON object."""
    record = {key: run.get(key) for key in RUN_JSON_FIELDS}
    record.update({key: state.get(key) for key in STATE_JSON_FIELDS})
    record["run_id"] = paths.run_id
    record["state"] = state.get("state", STARTING)
    record["log_path"] = paths.log
    record["run_dir"] = paths.dir
    return record


def load_record(paths: RunPaths) -> dict:
    return build_record(paths, read_run(paths), read_state(paths))


def live_gpu_sets(runs_dir: str) -> list:
    """The GPUs each live run of the runs directory claims (None: a run without --gpus, which may use any): what
    doctor's probe reports and the queue's scheduler counts as ours."""
    live = []
    for run_id in list_run_ids(runs_dir):
        paths = RunPaths(runs_dir, run_id)
        run, state = read_run(paths), read_state(paths)
        if is_live(paths, run, state):
            live.append(run.get("gpus"))
    return live
