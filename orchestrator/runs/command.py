"""The bundled trainer's command lines, built here only: a run on one target, one node of a job, the check.

The config travels as an input file of the run (CONFIG_INPUT in the run directory), so every command names
it the same way; torchrun starts the processes when there are several. A run works in its own run directory,
where no data is: the config's relative paths are taken from its base directory (config_base_dir), which the
trainer's train and check are given as --base-dir.
"""
from __future__ import annotations

import os

from ..inventory.model import Target

CONFIG_INPUT = "config.yaml"   # the bundled trainer's config, as the run directory holds it
TRAIN_ARGS = ("-m", "trainer", "train", "--config", CONFIG_INPUT)
TORCHRUN = ("-m", "torch.distributed.run")
# what a restarted attempt of the trainer gets on top: it goes on from its newest complete checkpoint
RESUME_ARGS = ("--resume", "auto")


def config_base_dir(target: Target, config: str) -> str:
    """Where a launched config's relative paths are taken from: on `local`, the config file's directory (the
    files sit on this machine, next to the config that names them, whatever directory dflashctl runs in); on a
    host or a container, its workdir (the config's directory on this machine means nothing there)."""
    if target.host.transport == "local":
        return os.path.dirname(os.path.abspath(os.path.expanduser(config)))
    return target.workdir


def train_command(target: Target, *, nproc: int, base_dir: str) -> list[str]:
    """A run on one target: the trainer itself, or torchrun (standalone rendezvous) with `nproc` processes."""
    launcher = [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    return [target.python, *launcher, *TRAIN_ARGS, "--base-dir", base_dir]


def node_train_command(target: Target, *, nnodes: int, nproc: int, endpoint: str, job_id: str, is_host: bool,
                       local_addr: str, timeout: float, base_dir: str, max_restarts: int = 0) -> list[str]:
    """torchrun for one node of a multi-node job (c10d rendezvous at `endpoint`). A job restarts as a whole:
    with `max_restarts`, a failed worker on any node has every node's torchrun restart all its workers together
    through the rendezvous (no controller involved), at most that many times; the trainer resumes then."""
    conf = f"is_host={str(is_host).lower()},join_timeout={timeout:g},read_timeout={min(timeout, 60.0):g}"
    return [target.python, *TORCHRUN, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", f"--rdzv-conf={conf}",
            f"--local-addr={local_addr}", f"--max-restarts={max_restarts}", *TRAIN_ARGS, "--base-dir", base_dir]


def runs_bundled_trainer(command: list[str]) -> bool:
    """CMD that runs the trainer itself (`python -m trainer generate ...`): it gets the bundled trainer deployed
    and on its PYTHONPATH, as a `--config` run does."""
    return any(flag == "-m" and module == "trainer" for flag, module in zip(command, command[1:]))


def check_command(target: Target, *, base_dir: str, source: str) -> list[str]:
    """The trainer's check of a config; the config comes on its stdin. The agent runs it in the run's environment."""
    return [target.python, "-m", "trainer", "check", "--config", "-", "--json", "--base-dir", base_dir,
            "--source", source]


def retry_args(command: list[str]) -> list[str]:
    """The arguments appended to a run's command from its second attempt on: `--resume auto` for the bundled
    trainer's `train` (its config may say `resume: never` or name one checkpoint, right for the first attempt
    only); nothing for any other command, which resumes (or not) on its own."""
    trains = any(command[i:i + 3] == ["-m", "trainer", "train"] for i in range(len(command)))
    return list(RESUME_ARGS) if trains else []
