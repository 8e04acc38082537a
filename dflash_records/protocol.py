"""What the agent and the controller both know: the one home of every name and value that crosses the wire.

Standard library only, like the whole of dflash_records (the agent's zipapp carries it to containers), and
imported by the agent and the controller alike, so each of these is defined here and nowhere else: the
protocol version, the run states, what may name a run and which --env keys a run may set, the exit statuses
and the agent's error codes, sizes, and when free space runs low. What
a terminal shows of a log line is terminaltext.py's; what a number is and what nvidia-smi says of a GPU are
digits.py's and gpu.py's, imported here too; the watch stream's messages are watchwire.py's.
"""
from __future__ import annotations

import datetime
import re
import time

# whether a text is a number is digits.py's (the shared records read numbers too); imported from here as well
from .digits import ascii_decimal  # noqa: F401
# the nvidia-smi query is the GPU row's (dflash_records/gpu.py), as is when a GPU counts as held; the watch
# stream's sampler reads the query from here
from .gpu import GPU_FIELDS, gpu_query_args  # noqa: F401

AGENT_VERSION = "0.1.0"
PROTOCOL_VERSION = 1  # every answer carries it as "version"; the controller refuses one it does not speak

# -- run states (DESIGN.md: [queued ->] starting -> running -> exactly one terminal state) ----------------------
# a queued run waits in its container's queue for its GPUs: it holds none and has no process yet; it leaves the
# queue as starting, or ends killed (killed while it waited) or failed (its start failed) without a process
QUEUED = "queued"
STARTING, RUNNING = "starting", "running"
SUCCEEDED, FAILED, KILLED, LOST = "succeeded", "failed", "killed", "lost"
LIVE_STATES = (STARTING, RUNNING)
TERMINAL_STATES = (SUCCEEDED, FAILED, KILLED, LOST)
FAILED_STATES = (FAILED, LOST)  # ended without being asked to: what a job's first failure is looked for in
RUN_STATES = (QUEUED,) + LIVE_STATES + TERMINAL_STATES

# -- names: run ids, run names, job ids -----------------------------------------------------------------------
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_run_id(value: object) -> bool:
    """Whether `value` may name a run, a job or a run's name (fullmatch, not match + $: `$` takes a newline)."""
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


# -- where dflashctl keeps its files in a workdir: runs, the agent, packages, the compile cache -----------------
STATE_DIR = ".dflash"


def state_path(workdir: str, *parts: str) -> str:
    """`{workdir}/.dflash/PART/...`, a path on the target (always `/`-separated)."""
    return "/".join((workdir, STATE_DIR) + parts)


# -- time stamps in records: ISO 8601 in UTC with a Z -----------------------------------------------------------
def iso_utc(seconds: float | None = None, *, timespec: str = "milliseconds") -> str:
    """`2026-05-01T12:00:00.123Z` for `seconds` since the epoch (now when None)."""
    stamp = datetime.datetime.fromtimestamp(time.time() if seconds is None else seconds, datetime.timezone.utc)
    return stamp.isoformat(timespec=timespec).replace("+00:00", "Z")

ENV_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what --env may set
# what the agent sets for every run itself: --env may not
RESERVED_ENV_KEYS = ("DFLASH_RUN_ID", "DFLASH_RUNS_DIR", "DFLASH_RUN_DIR", "CUDA_VISIBLE_DEVICES")


def env_pair(pair: str) -> tuple:
    """(KEY, VALUE) of one `--env KEY=VALUE`, checked alike by the CLI (before anything is contacted) and the
    agent; a ValueError says what is wrong: no '=', a KEY that is not an ASCII name (what every shell and
    os.environ take), or a KEY the agent sets for every run itself."""
    key, sep, value = pair.partition("=")
    if not sep or ENV_KEY_PATTERN.fullmatch(key) is None:
        raise ValueError("use KEY=VALUE with KEY made of ASCII letters, digits and _, not starting with a digit")
    if key in RESERVED_ENV_KEYS:
        raise ValueError("{} is set by the agent for every run".format(key))
    return key, value


# -- what a launch may ask for --------------------------------------------------------------------------------
MAX_GPU_INDEX = 1023
NO_GPUS = "none"        # --gpus none: a run that uses no GPU (CUDA_VISIBLE_DEVICES empty, holds none)
DEFAULT_GRACE_S = 30.0  # seconds a kill waits between TERM and KILL unless the run or the kill says otherwise
UPLOAD_STALL_S = 60.0   # a receiver of an upload gives up after this long without a byte (a dead link)

# -- exit statuses: dflashctl's (DESIGN.md) and the agent's, which uses the first three -----------------------
EXIT_OK = 0
EXIT_FAILED = 1         # the operation ran and failed (a run failed, something survived a kill)
EXIT_USAGE = 2          # bad usage, a bad inventory or config: the user can fix what they typed
EXIT_UNREACHABLE = 3    # a target could not be reached (the controller's only: the agent runs where it is)
# the agent's error codes
BAD_USAGE, UNKNOWN_RUN, BAD_RUN_ID, NO_COMMAND = "bad_usage", "unknown_run", "bad_run_id", "no_command"
CHECK_FAILED, INTERNAL_ERROR = "check_failed", "internal_error"
# a launch whose run was started but not seen running within the verify bound: it is left running
NOT_VERIFIED = "not_verified"
# a relaunch refused (why), the loss found already relaunched (by another watcher: a note, not an error), and
# processes of the lost run that survived SIGKILL (nothing started: the caller tries again later)
NOT_RELAUNCHED, ALREADY_RELAUNCHED, SURVIVORS_LEFT = "not_relaunched", "already_relaunched", "survivors_left"
# the answer of the controller's checked call (runs/agentcall.py) when this version's agent is not on the target
# whole (said by the shell in front of the agent, with "agent"), or a trainer run's package is not (said by the
# agent's --lease-pkg, with "pkg")
NEEDS_DEPLOY = "needs_deploy"
# codes that mean the caller asked for something wrong (the controller reports them as usage errors)
USAGE_CODES = (BAD_USAGE, UNKNOWN_RUN, BAD_RUN_ID)

# -- the watch stream's messages (agent -> controller), by their "t" ----------------------------------------
# The bytes just before a followed log's offset that the watch agent compares on every poll (the controller
# sends the ones it has when it resumes): a truncation, a replacement or a rewrite in place all show.
FINGERPRINT_BYTES = 64
# The messages themselves, typed, with their codec: dflash_records/watchwire.py.

# -- a run's log: the supervisor's own lines (a restart and why, a hang, a command that could not start) begin
# with this (supervisor.py's `say`); they are never the workload's output, whatever exception they quote
SUPERVISOR_LINE_PREFIX = "dflash: "

# -- sizes: bytes in a KiB, MiB, GiB (nvidia-smi counts MiB, /proc/meminfo and df KiB, people read GiB) -------
KIB = 1024
MIB = 1024 ** 2
GIB = 1024 ** 3
# Free space: below LOW_FREE_BYTES, or below LOW_FREE_FRACTION of the filesystem, a long run is about to lose its
# log and checkpoints (doctor warns, watch raises low_disk, the CLI offers them as defaults).
LOW_FREE_BYTES = 2 * GIB
LOW_FREE_FRACTION = 0.05


def low_free(free: int, total: int, *, min_bytes: float = LOW_FREE_BYTES,
             fraction: float = LOW_FREE_FRACTION) -> bool:
    """Room for a long run's log and checkpoints is running out (the one test doctor and watch both apply)."""
    return free < min_bytes or (total > 0 and free < fraction * total)
