"""What a run is before it exists: its id and name, where its directory lies, and what to start (LaunchSpec).

Pure: no IO. The run client (client.py) turns a LaunchSpec into an agent launch; a job (jobs.py) makes one a node.
"""
from __future__ import annotations

import datetime
import re
import secrets
from dataclasses import dataclass, field
from typing import Sequence

from dflash_records.protocol import DEFAULT_GRACE_S, is_run_id, state_path

from ..errors import UsageError, shorten
from ..inventory.model import Target
from .compilecache import cache_env

NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def runs_dir(target: Target) -> str:
    return state_path(target.workdir, "runs")


def run_dir(target: Target, run_id: str) -> str:
    return f"{runs_dir(target)}/{run_id}"


def new_run_id(name: str, *, now: datetime.datetime | None = None) -> str:
    """`<name>-<yymmdd>-<hhmmss>-<4 hex>`: sortable by time, readable, unique without coordination."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{name[:36]}-{now:%y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def default_name(command: Sequence[str]) -> str:
    """A run name from a command: its program's base name, reduced to the characters a name may have."""
    if not command:
        return "train"
    base = command[0].rsplit("/", 1)[-1]
    if base.startswith("python") and len(command) > 2 and command[1] == "-m":
        base = command[2]
    cleaned = NAME_CHARS.sub("-", base).strip("-._")
    return (cleaned or "run")[:36]


def check_run_id(run_id: str) -> str:
    if not is_run_id(run_id):
        raise UsageError(f"invalid run id {shorten(run_id)!r}: run ids are letters, digits, '.', '_' and '-' "
                         f"(see `dflashctl ps`)")
    return run_id


def check_name(name: str) -> str:
    if not is_run_id(name):
        raise UsageError(f"invalid run name {shorten(name)!r}: use up to 64 letters, digits, '.', '_' or '-', "
                         f"starting with a letter or digit")
    return name


@dataclass(frozen=True)
class NodePlace:
    """Where a multi-node job's node run stands: its job, its rank, how many nodes the job has."""

    job_id: str
    node_rank: int
    nnodes: int


@dataclass
class LaunchSpec:
    target: Target
    command: list[str]
    name: str
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] | None = None
    force: bool = False
    grace: float = DEFAULT_GRACE_S
    inputs: dict[str, bytes] = field(default_factory=dict)   # files put into the run directory before start
    uses_trainer: bool = False
    settle: float | None = None   # how long the workload must stay up to count as started (agent default 1 s)
    run_id: str | None = None     # chosen by the caller (a job's node runs); a new one otherwise
    job: NodePlace | None = None   # a multi-node job's node run: its place in the job
    check_config: str | None = None   # the trainer config's name: inputs[CONFIG_INPUT] is checked there first
    restart: str | None = None    # never|on-failure[:N] (checked); None: the target's inventory default
    restart_backoff: float | None = None   # seconds before the first restart (agent default 10, doubling)
    hang_timeout: float | None = None      # the hang watchdog's bound (0: off; None: from the step interval)
    worker_restarts: int = 0      # the workload (a job node's torchrun) restarts its own workers this often
    config_base: str | None = None    # where that config's relative paths are taken from (command.config_base_dir)
    queue: bool = False           # wait in the target's queue when its GPUs are held, instead of being refused
    gpu_count: int | None = None  # any N free GPUs of the target (the agent picks them), instead of `gpus`

    def run_env(self) -> dict[str, str]:
        return run_environment(self.target, self.env)

    def restart_policy(self) -> str:
        return self.restart or self.target.restart


def run_environment(target: Target, env: dict[str, str]) -> dict[str, str]:
    """The environment a run gets on top of the target's: the compile caches under the workdir, then the
    user's --env, which wins."""
    return {**cache_env(target), **env}
