"""`launch`: create the run directory, have the keeper start its supervisor, and return once it is verified."""
from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import shutil
import time

from dflash_records.answers import LaunchAnswer
from dflash_records.protocol import LOST, NOT_VERIFIED, RUNNING, STARTING, TERMINAL_STATES, iso_utc
from dflash_records.run import RunRecord

from . import keeper, procfs
from .errors import BadInput, OperationFailed
from .rundir import (RUN_DIR_FILES, RunPaths, file_lock, launch_lock, list_run_ids, make_reserve, parse_env_pairs,
                     parse_gpus, tail_lines, validate_name, validate_target, write_json_atomic)
from .runstate import finish, is_live, load_record, read_run, read_state, supervisor_alive, update_state
from .spawn import agent_entry, entry_env
from .supervisor import LEFTOVERS_LIMIT_S

MAX_INPUT_BYTES = 16 * 1024 * 1024
LOG_TAIL_LINES = 40
DIAGNOSTIC_TAIL_LINES = 10
POLL_S = 0.02
MAX_SWEEP_VALUES_CHARS = 4096
# room beyond the supervisor's own limit for ending leftovers: its /proc scans between rounds, on a loaded machine
RECORD_SLACK_S = 5.0


class LaunchRequest:
    def __init__(self, *, runs_dir: str, run_id: str, name: str, target: str, command: list, cwd: str | None,
                 env_pairs: list, gpus: str | None, force: bool, grace: float, inputs: dict | None = None,
                 job: dict | None = None, pythonpath: list | None = None,
                 keeper_idle: float | None = None, restart: dict | None = None,
                 gpu_count: int | None = None, sweep: dict | None = None) -> None:
        self.paths = RunPaths(runs_dir, run_id)
        self.name = validate_name(name, what="name")
        self.target = validate_target(target)
        if not command or not command[0]:
            raise BadInput("nothing to run: give the command after --", code="no_command")
        self.command = list(command)
        # By default a run works in its own directory: its inputs (the trainer config) are there, and what a
        # command writes to relative paths lands beside its log instead of wherever pct exec happened to start
        # (the bundled trainer takes its config's relative paths from --base-dir instead: runs/command.py).
        self.cwd = os.path.abspath(cwd) if cwd else self.paths.dir
        if cwd and not os.path.isdir(self.cwd):
            raise BadInput("--cwd {!r} is not a directory".format(self.cwd), code="bad_cwd")
        self.env = parse_env_pairs(env_pairs)
        # prepended by the supervisor to the PYTHONPATH the run inherits there, never replacing it
        self.pythonpath = [os.path.abspath(entry) for entry in pythonpath or []]
        self.gpus = parse_gpus(gpus) if gpus is not None else None
        self.force = force
        if grace < 0:
            raise BadInput("--grace must not be negative", code="bad_grace")
        self.grace = grace
        self.inputs = inputs or {}
        self.job = job or {"job_id": None, "node_rank": None, "nnodes": None}
        self.keeper_idle = keeper_idle  # for a keeper this launch starts (None: its default)
        # the restart policy (dflash_records/restart.py), its backoff base, the hang watchdog's bound, the
        # arguments of a restarted attempt
        self.restart = restart or {}
        self.sweep = sweep or {"sweep_id": None, "sweep_values": None}
        self.gpu_count = gpu_count  # --gpu-count N (a queued run): any N free GPUs, chosen when it starts

    def run_json(self) -> dict:
        return {"version": 1, "run_id": self.paths.run_id, "name": self.name, "target": self.target,
                "command": self.command, "cwd": self.cwd, "env": self.env, "pythonpath": self.pythonpath,
                "gpus": self.gpus, "gpu_count": self.gpu_count,
                "grace_s": self.grace, "created_at": iso_utc(), "created_ts": time.time(),
                "supervisor_pid": None, "supervisor_start_time": None, **self.job, **self.restart, **self.sweep}


def job_fields(job_id: str | None, node_rank: int | None, nnodes: int | None) -> dict:
    """The job a node run belongs to: all three given, or none (a plain run)."""
    given = [value is not None for value in (job_id, node_rank, nnodes)]
    if not any(given):
        return {"job_id": None, "node_rank": None, "nnodes": None}
    if not all(given):
        raise BadInput("--job-id, --node-rank and --nnodes go together", code="bad_job")
    validate_name(job_id, what="job id")
    if not 0 < nnodes <= 4096 or not 0 <= node_rank < nnodes:
        raise BadInput("--node-rank {} of --nnodes {}: need 0 <= rank < nnodes".format(node_rank, nnodes),
                       code="bad_job")
    return {"job_id": job_id, "node_rank": node_rank, "nnodes": nnodes}


def sweep_fields(sweep_id: str | None, values_text: str | None) -> dict:
    """The sweep a run belongs to and the values of the grid's keys it runs (a JSON object of scalars)."""
    if sweep_id is None:
        if values_text is not None:
            raise BadInput("--sweep-values needs --sweep-id", code="bad_sweep")
        return {"sweep_id": None, "sweep_values": None}
    validate_name(sweep_id, what="sweep id")
    try:
        values = json.loads(values_text or "{}")
    except ValueError:
        values = None
    scalar = (str, int, float, bool, type(None))
    if not isinstance(values, dict) or len(values_text or "") > MAX_SWEEP_VALUES_CHARS or \
            not all(isinstance(value, scalar) for value in values.values()):
        raise BadInput("--sweep-values needs a JSON object of scalars, at most {} characters".format(
            MAX_SWEEP_VALUES_CHARS), code="bad_sweep")
    return {"sweep_id": sweep_id, "sweep_values": values}


def read_inputs(names: list, raw: bytes) -> dict:
    """name -> bytes from stdin's JSON object {name: base64}; exactly the names given with --input."""
    if len(raw) > MAX_INPUT_BYTES:
        raise BadInput("--input data larger than {} bytes".format(MAX_INPUT_BYTES), code="bad_input")
    try:
        packed = json.loads(raw.decode("utf-8"))
        inputs = {str(k): base64.b64decode(v, validate=True) for k, v in packed.items()}
    except (ValueError, AttributeError, TypeError, binascii.Error):
        raise BadInput("--input needs a JSON object {name: base64 content} on stdin", code="bad_input")
    for name in names:
        validate_name(name, what="input name")
        if name in RUN_DIR_FILES:
            raise BadInput("input name {} is one of the run's own files".format(name), code="bad_input")
    if sorted(inputs) != sorted(set(names)):
        raise BadInput("stdin holds {} but --input names {}".format(sorted(inputs), sorted(set(names))),
                       code="bad_input")
    return inputs


def busy_gpus(runs_dir: str, gpus: list | None, *, exclude: str) -> dict:
    """run id -> the requested GPUs that a live run of this runs directory holds.

    A run without --gpus sees every GPU (no CUDA_VISIBLE_DEVICES), so it holds all of them against a run that
    names its GPUs, and the other way round. Two runs that name none share the target as before (CPU jobs).
    """
    clashes = {}
    for run_id in list_run_ids(runs_dir):
        if run_id == exclude:
            continue
        paths = RunPaths(runs_dir, run_id)
        run, state = read_run(paths), read_state(paths)
        held = run.get("gpus")
        if gpus is None and held is None:
            continue
        both = sorted(held or []) if gpus is None else sorted(set(gpus) if held is None else set(gpus) & set(held))
        if both and is_live(paths, run, state):
            clashes[run_id] = both
    return clashes


def live_namesakes(runs_dir: str, name: str, *, exclude: str) -> list:
    """The live runs of this runs directory that carry `name` too (`kill NAME` would have to ask which)."""
    same = []
    for run_id in list_run_ids(runs_dir):
        paths = RunPaths(runs_dir, run_id)
        run = read_run(paths) if run_id != exclude else {}
        if run.get("name") == name and is_live(paths, run, read_state(paths)):
            same.append(run_id)
    return same


def create_run(req: LaunchRequest) -> None:
    with file_lock(launch_lock(req.paths.runs_dir)):
        create_run_locked(req)


def create_run_locked(req: LaunchRequest, *, state: dict | None = None) -> None:
    """Under launch_lock: refuse busy GPUs (unless forced or queued: `state` given), then make the run's
    directory with its run.json and state.json (`state`, else starting)."""
    runs_dir = req.paths.runs_dir
    if req.gpus != [] and not req.force and state is None:
        clashes = busy_gpus(runs_dir, req.gpus, exclude=req.paths.run_id)
        if clashes:
            raise OperationFailed("GPUs already held by a live run: {} (--force starts it anyway; a run "
                                  "that uses no GPU: --gpus none)".format(
                ", ".join("{} ({})".format(r, ",".join(map(str, g))) for r, g in sorted(clashes.items()))),
                code="gpus_busy", details={"busy": clashes})
    try:
        os.mkdir(req.paths.dir, 0o755)
    except FileExistsError:
        raise BadInput("run {} already exists".format(req.paths.run_id), code="run_exists")
    try:
        _fill_run_dir(req, state or {"state": STARTING})
    except OSError as exc:  # a full disk, say: leave no half-made run behind to be listed
        shutil.rmtree(req.paths.dir, ignore_errors=True)
        full = exc.errno == errno.ENOSPC
        raise OperationFailed("cannot create run {} in {}: {}".format(
            req.paths.run_id, runs_dir, "disk full (no space left on device)" if full else exc),
            code="disk_full" if full else "run_dir_failed")


def _fill_run_dir(req: LaunchRequest, state: dict) -> None:
    make_reserve(req.paths.reserve)  # first: no run starts without room to record its end
    for name, data in sorted(req.inputs.items()):
        with open(os.path.join(req.paths.dir, name), "wb") as handle:
            handle.write(data)
    write_json_atomic(req.paths.run_json, req.run_json())
    write_json_atomic(req.paths.state_json, dict(state, version=1, run_id=req.paths.run_id, updated_at=iso_utc()))


def start_supervisor(paths: RunPaths, keeper_idle: float | None) -> None:
    entry, pythonpath = agent_entry()
    env = entry_env(os.environ, pythonpath)
    keeper.start_and_request(paths.runs_dir, paths.run_id, entry=entry, env=env, log_path=paths.supervisor_log,
                             idle_exit=keeper_idle)


def verified(paths: RunPaths, state: dict) -> bool:
    return (state.get("state") == RUNNING and supervisor_alive(paths, state)
            and procfs.is_alive(state.get("pid"), state.get("pid_start_time")) and os.path.exists(paths.log))


def restarting(paths: RunPaths, state: dict) -> bool:
    """The first attempt has ended and its supervisor, alive, goes on under the run's restart policy: the run
    lives, whatever became of that attempt."""
    return bool(state.get("restart_at") or (state.get("attempt") or 1) > 1) and supervisor_alive(paths, state)


def workload_exited(state: dict) -> bool:
    """The supervisor started the workload and that process is gone (or a zombie): the run has ended, whether
    or not its supervisor has recorded how yet."""
    return (state.get("state") == RUNNING and bool(state.get("pid"))
            and not procfs.is_alive(state.get("pid"), state.get("pid_start_time")))


def wait_verified(paths: RunPaths, *, timeout: float, settle: float) -> str:
    """'verified', 'ended' or 'unverified'. Verified = still running `settle` s after we first saw it run.

    A workload seen to have exited has ended, whatever the clock says: from then on the launch waits for its
    supervisor to record how (it first ends what the workload left behind, up to LEFTOVERS_LIMIT_S), not for
    the verify timeout, so a command that died at once is not answered 'not verified' while its end is recorded.
    """
    deadline = time.monotonic() + timeout
    running_since = exited_at = None
    while True:
        now = time.monotonic()  # before the read: a state read after a stall is never judged by an older clock
        state = read_state(paths)
        if state.get("state") in TERMINAL_STATES:
            return "ended"
        if restarting(paths, state):
            return "verified"
        if verified(paths, state):
            running_since = running_since if running_since is not None else now
            if now - running_since >= settle:
                return "verified"
        elif state.get("supervisor_pid") and not supervisor_alive(paths, state):
            finish(paths, LOST, error="supervisor died during launch")
            return "ended"
        elif exited_at is None and workload_exited(state):
            exited_at = now
            deadline = max(deadline, now + LEFTOVERS_LIMIT_S + RECORD_SLACK_S)
        if now >= deadline:
            return _give_up(paths)
        time.sleep(POLL_S)


def _give_up(paths: RunPaths) -> str:
    """At the deadline: a run no supervisor has claimed is lost, its spawn cancelled; one whose end was recorded
    since the last look has ended; any other is unverified."""
    state = read_state(paths)
    if state.get("state") in TERMINAL_STATES:
        return "ended"
    if state.get("state") == STARTING and not state.get("supervisor_pid"):
        keeper.cancel_spawn(paths.runs_dir, paths.run_id)
        # Under the run's lock, and only if still unclaimed: a supervisor the keeper had already started may
        # have claimed the run since the read above, and then starts the workload and records its end itself.
        if update_state(paths, _lost_unless_claimed).get("state") == LOST:
            return "ended"
    return "unverified"


def _lost_unless_claimed(state: dict) -> dict | None:
    if state.get("state") != STARTING or state.get("supervisor_pid"):
        return None
    state.update(state=LOST, ended_at=iso_utc(), error="the supervisor did not start in time")
    return state


def launch(req: LaunchRequest, *, verify_timeout: float, settle: float) -> LaunchAnswer:
    create_run(req)
    return start_verified(req.paths, req.name, keeper_idle=req.keeper_idle, verify_timeout=verify_timeout,
                          settle=settle)


def start_verified(paths: RunPaths, name: str, *, keeper_idle: float | None, verify_timeout: float,
                   settle: float, spawned: bool = False) -> LaunchAnswer:
    """Have the keeper start the supervisor of a created (or just dequeued) run (unless it did already:
    `spawned`), and return once it is verified; an OperationFailed (run_ended, not_verified) with the ends of its
    logs when it is not."""
    if not spawned:
        start_supervisor(paths, keeper_idle)
    # said with the answer, so that the warning costs the controller no listing of its own
    namesakes = live_namesakes(paths.runs_dir, name, exclude=paths.run_id)
    outcome = wait_verified(paths, timeout=verify_timeout, settle=settle)
    record = load_record(paths)
    if outcome == "verified":
        return LaunchAnswer(ok=True, run=RunRecord.from_dict(record), namesakes=tuple(namesakes))
    details = {"run": record, "exit_code": record.get("exit_code"), "signal": record.get("signal"),
               "log_tail": tail_lines(paths.log, LOG_TAIL_LINES),
               # why a supervisor never started or died is in these, not in the workload's log
               "supervisor_log_tail": tail_lines(paths.supervisor_log, DIAGNOSTIC_TAIL_LINES),
               "keeper_log_tail": tail_lines(keeper.KeeperPaths(paths.runs_dir).log, DIAGNOSTIC_TAIL_LINES)}
    if outcome == "ended":
        raise OperationFailed("run {} ended during launch: {}".format(paths.run_id,
                                                                       RunRecord.from_dict(record).ended_text()),
                              code="run_ended", details=details)
    raise OperationFailed("run {} could not be verified running within {} s".format(paths.run_id, verify_timeout),
                          code=NOT_VERIFIED, details=details)
