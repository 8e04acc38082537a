"""One training job across several nodes: torchrun under a supervisor on every node, one c10d rendezvous.

A job is a set of ordinary runs, one per node, that share a job id and know their node rank: every run
operation (ps, kill, logs, cleanup) works on them as on any run, and this module only adds what is
job-wide: deploying everywhere before anything starts, choosing the rendezvous endpoint (the first node's
inventory address, a port found free there), starting the nodes, and summing the nodes up into one job.

torchrun's c10d rendezvous orders nodes by their address, not by the order the user gave; the trainer
therefore takes its global rank from DFLASH_RANK_OFFSET (the processes of the nodes before it) plus its
local rank, so node 0, the first target, holds rank 0: its log has the job's step lines and its output
directory the checkpoints, on every start of the job alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from dflash_records.answers import LaunchAnswer
from dflash_records.job import FirstFailure, JobSummary, LaunchedJob
from dflash_records.protocol import DEFAULT_GRACE_S, FAILED, FAILED_STATES, KILLED, LIVE_STATES, RUNNING, SUCCEEDED
from dflash_records.restart import BACKOFF_BASE_S, BACKOFF_ENV, NEVER, ON_FAILURE, parse_policy
from dflash_records.run import RunRecord

from ..errors import DflashError, OperationFailed, UsageError
from ..inventory.model import Target
from ..transports.timeouts import DEFAULT_DIST_TIMEOUT_S
from ..transports.fanout import Outcome, fanout_exit_code, per_host
from .agentcall import agent_argv
from .client import LaunchFailed, LaunchUnverified, Relaunched, RunClient
from .command import CONFIG_INPUT, config_base_dir, node_train_command
from .deploy import agent_path_in
from .spec import LaunchSpec, NodePlace, new_run_id, run_environment
from .trainerconfig import ConfigRejected

ABORT_GRACE_S = 5.0


@dataclass
class JobSpec:
    targets: list[Target]
    config_text: bytes
    name: str
    config_source: str = "config.yaml"   # the config's name in the trainer check's messages
    gpus: list[int] | None = None
    nproc_per_node: int | None = None   # None: one per GPU, one CPU process where there are none
    cpu_only: bool = False              # the config asks for the CPU: one process per node unless told
    env: dict[str, str] = field(default_factory=dict)
    force: bool = False
    grace: float = DEFAULT_GRACE_S
    dist_timeout: float = DEFAULT_DIST_TIMEOUT_S
    restart: str | None = None            # never|on-failure[:N]; None: the first target's inventory default
    hang_timeout: float | None = None     # the hang watchdog's bound on node 0 (where the step lines are)
    restart_backoff: float | None = None  # seconds before the workers' first restart (agent default, doubling)


class JobLaunchFailed(OperationFailed):
    """A node could not be deployed or did not start; the nodes already started were stopped again."""

    def __init__(self, message: str, *, node_answer: LaunchAnswer | None = None,
                 exit_code: int | None = None) -> None:
        self.answer = node_answer
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(message)


def node_run_id(job_id: str, node_rank: int) -> str:
    return f"{job_id}-n{node_rank}"


def processes_per_node(target: Target, gpus: list[int] | None) -> int:
    """One trainer process per GPU it may use (all of the target's without --gpus); one CPU process where that
    is none (`--gpus none`, or a target without GPUs)."""
    return max(len(gpus), 1) if gpus is not None else max(target.gpus, 1)


def nproc_for(target: Target, spec: JobSpec) -> int:
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    if spec.cpu_only:
        return 1
    return processes_per_node(target, spec.gpus)


def rendezvous_host(target: Target) -> str:
    if target.host.address:
        return target.host.address
    if target.host.transport == "local":
        return "127.0.0.1"
    raise UsageError(f"{target.name}: the first node needs an address in the inventory (the rendezvous endpoint)")


def torchrun_command(target: Target, *, agent_path: str, nnodes: int, nproc: int, endpoint: str, job_id: str,
                     is_host: bool, local_addr: str, timeout: float, base_dir: str, max_restarts: int = 0) -> list[str]:
    """torchrun for one node, under the agent's node-watch (which ends a torchrun that outlives its workers
    by `timeout`: it is then stuck talking to an unreachable rendezvous store)."""
    return [*agent_argv(target, agent_path, "node-watch", f"--stall={timeout:g}", "--"),
            *node_train_command(target, nnodes=nnodes, nproc=nproc, endpoint=endpoint, job_id=job_id,
                                is_host=is_host, local_addr=local_addr, timeout=timeout, base_dir=base_dir,
                                max_restarts=max_restarts)]


def _raise_first_error(outcomes: list[Outcome], what: str) -> None:
    failed = [o for o in outcomes if not o.ok]
    if failed:
        details = "; ".join(f"{o.target.name}: {o.error}" for o in failed)
        raise JobLaunchFailed(f"{what} failed, nothing was started: {details}", exit_code=fanout_exit_code(failed))


def check_every_node(client: RunClient, spec: JobSpec) -> None:
    """The trainer's check of the config on every node, before any node starts; every node's reasons."""
    outcomes = per_host(spec.targets, lambda t: client.check_trainer_config(
        t, spec.config_text, source=spec.config_source, env=run_environment(t, spec.env)))
    rejected = [o.error for o in outcomes if not o.ok and isinstance(o.error, ConfigRejected)]
    if rejected and len(rejected) == sum(not o.ok for o in outcomes):
        raise UsageError("\n".join(str(error) for error in rejected))
    _raise_first_error(outcomes, "checking the config")


def node_specs(client: RunClient, spec: JobSpec, job_id: str) -> tuple[str, list[LaunchSpec]]:
    """(rendezvous endpoint, what each node starts); asks every node how it reaches the first."""
    first = spec.targets[0]
    host = rendezvous_host(first)
    port = client.netinfo(first, host, free_port=True).port
    nets = per_host(spec.targets, lambda t: client.netinfo(t, host))
    _raise_first_error(nets, "finding the way to the rendezvous")
    nprocs = [nproc_for(t, spec) for t in spec.targets]
    restarts = job_restarts(spec)
    specs, offset = [], 0
    for rank, (target, net, nproc) in enumerate(zip(spec.targets, nets, nprocs)):
        # a store of the workers' own, fresh on every attempt: in torchrun's shared one a restarted worker can
        # read an address the previous attempt's dead worker published (pytorch #135712)
        env = {"DFLASH_DIST_TIMEOUT_S": f"{spec.dist_timeout:g}", "DFLASH_RANK_OFFSET": str(offset),
               "DFLASH_NODE_RANK": str(rank), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        if restarts:   # torchrun restarts at once: the workers wait the policy's backoff themselves
            backoff = BACKOFF_BASE_S if spec.restart_backoff is None else spec.restart_backoff
            env[BACKOFF_ENV] = f"{backoff:g}"
        if net.value.interface:
            # gloo and NCCL bind to what the hostname resolves to; a container's often resolves nowhere
            env.update(GLOO_SOCKET_IFNAME=net.value.interface, NCCL_SOCKET_IFNAME=net.value.interface)
        env.update(spec.env)
        # the config check of every node (check_every_node) put this version's agent and trainer there
        command = torchrun_command(target, agent_path=agent_path_in(target.workdir), nnodes=len(spec.targets),
                                   nproc=nproc,
                                   endpoint=f"{host}:{port}", job_id=job_id, is_host=rank == 0,
                                   local_addr=net.value.address, timeout=spec.dist_timeout,
                                   base_dir=config_base_dir(target, spec.config_source), max_restarts=restarts)
        # never one node alone: its supervisor leaves restarts to torchrun, which restarts every node's workers
        specs.append(LaunchSpec(target=target, command=command, name=spec.name, env=env, gpus=spec.gpus,
                                force=spec.force, grace=spec.grace, inputs={CONFIG_INPUT: spec.config_text},
                                uses_trainer=True, run_id=node_run_id(job_id, rank),
                                job=NodePlace(job_id=job_id, node_rank=rank, nnodes=len(spec.targets)),
                                restart=NEVER, hang_timeout=spec.hang_timeout, worker_restarts=restarts))
        offset += nproc
    return f"{host}:{port}", specs


def job_restarts(spec: JobSpec) -> int:
    """How many times the job restarts as a whole: --restart, else the first target's inventory default."""
    policy = parse_policy(spec.restart or spec.targets[0].restart)
    return int(policy["max_restarts"]) if policy["policy"] == ON_FAILURE else 0


def launch_job(client: RunClient, spec: JobSpec) -> LaunchedJob:
    """Check the config on every node (which deploys what is missing there, so that no node waits at the
    rendezvous for another's upload), then start every node; returns the job with one record per node."""
    names = [t.name for t in spec.targets]
    if len(set(names)) != len(names):
        raise UsageError(f"a target appears twice: {' '.join(names)}")
    job_id = new_run_id(spec.name)
    check_every_node(client, spec)
    endpoint, node_launches = node_specs(client, spec, job_id)
    specs = {s.target.name: s for s in node_launches}
    outcomes = per_host(spec.targets, lambda t: client.launch(specs[t.name]))
    failed = [o for o in outcomes if not o.ok]
    if failed:  # a node started but not seen running is stopped too: a job does not run without all its nodes
        _abort(client, [o for o in outcomes if o.ok] + [Outcome(o.target, value=o.error.run) for o in failed
                                                          if isinstance(o.error, LaunchUnverified)])
        first = failed[0]
        answer = first.error.answer if isinstance(first.error, LaunchFailed) else None
        # an unverified node's own error says it is left running: here it was stopped with the others
        why = first.error.said if isinstance(first.error, LaunchUnverified) else first.error
        raise JobLaunchFailed(f"job {job_id}: node {names.index(first.target.name)} ({first.target.name}) did "
                              f"not start: {why}; the other nodes were stopped", node_answer=answer,
                              exit_code=fanout_exit_code(failed))
    nodes = tuple(o.value for o in outcomes)
    return LaunchedJob(job_id=job_id, name=spec.name, rendezvous=endpoint, state=job_state(nodes), nodes=nodes)


def relaunch_job(client: RunClient, nodes: list[tuple[Target, str, int]], name: str, *,
                 grace: float | None = None) -> tuple[str, list[Relaunched]]:
    """A job lost with one of its containers, started again as a whole under a new job id: every node, as
    (target, run id, node rank), relaunched by its agent, node 0 first (its claim is the job's: a second
    watcher is refused there and starts nothing). Each node runs its recorded command, the rendezvous at node
    0 as before, and resumes from node 0's newest checkpoint. (new job id, what started on each node).
    An error of node 0 comes as it was, with the agent's code (the caller tells a loss another watcher healed,
    and one that may be tried again, from the rest); a later node's is this job relaunch's failure."""
    job_id = new_run_id(name or "job")
    started: list[Outcome] = []
    done: list[Relaunched] = []
    for target, run_id, rank in sorted(nodes, key=lambda node: node[2]):
        try:
            node = client.relaunch(target, run_id, name=name, new_id=node_run_id(job_id, rank), job_id=job_id,
                                   grace=grace)
        except DflashError as exc:
            if not started:
                raise
            _abort(client, started)  # never part of a job: the nodes started so far would wait for the rest
            raise OperationFailed(f"job relaunch {job_id}: node {rank} ({target.name}): {exc}") from exc
        started.append(Outcome(target, value=node.record))
        done.append(node)
    return job_id, done


def _abort(client: RunClient, started: list[Outcome]) -> None:
    for outcome in started:
        try:
            client.kill(outcome.target, [outcome.value.run_id], grace=ABORT_GRACE_S)
        except DflashError:
            pass  # the launch error is what the user needs; ps shows what is left


# ---- a job from its node records ------------------------------------------------------------------------

def job_state(nodes: Sequence[RunRecord]) -> str:
    states = [node.state for node in nodes]
    if any(s in LIVE_STATES for s in states):
        return RUNNING
    if any(s in FAILED_STATES for s in states):
        return FAILED
    if any(s == KILLED for s in states):
        return KILLED
    return SUCCEEDED


def failed_first(nodes: Sequence[RunRecord]) -> FirstFailure | None:
    """The node that failed first (earliest end among failed or lost nodes), and why."""
    failed = [run for run in nodes if run.state in FAILED_STATES]
    if not failed:
        return None
    run = min(failed, key=lambda r: (r.ended_at or "~", r.node_rank or 0))
    return FirstFailure(node_rank=run.node_rank, target=run.target, run_id=run.run_id, state=run.state,
                        exit_code=run.exit_code, signal=run.signal, ended_at=run.ended_at,
                        reason=f"node {run.node_rank} ({run.target}) {run.state}: {run.end_cause() or run.state}")


def summarize(nodes: Sequence[RunRecord]) -> JobSummary:
    """The job of these node records (ps's job object), which it lists sorted by node rank."""
    runs = sorted(nodes, key=lambda node: node.node_rank or 0)
    head = runs[0]
    ended = None if any(r.state in LIVE_STATES for r in runs) else max(r.ended_at or "" for r in runs) or None
    return JobSummary(job_id=head.job_id, name=head.name, state=job_state(runs), nnodes=head.nnodes or len(runs),
                      targets=tuple(r.target for r in runs), created_at=min(r.created_at or "" for r in runs),
                      ended_at=ended, last_step=head.last_step if head.node_rank == 0 else None,
                      tok_per_s=head.tok_per_s if head.node_rank == 0 else None, failed_first=failed_first(runs),
                      relaunched_as=successor_job(head), nodes=tuple(runs))


def successor_job(node0: RunRecord) -> str | None:
    """The job that a relaunch started in place of this one: node 0's successor names it (node_run_id)."""
    suffix = f"-n{node0.node_rank or 0}"
    after = node0.relaunched_as
    return after[:-len(suffix)] if after and after.endswith(suffix) else after


def group_jobs(records: Sequence[RunRecord]) -> tuple[list[RunRecord], list[JobSummary]]:
    """(plain runs, jobs): the node records of each job folded into one summary."""
    plain: list[RunRecord] = []
    by_job: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.job_id:
            by_job.setdefault(record.job_id, []).append(record)
        else:
            plain.append(record)
    return plain, [summarize(nodes) for nodes in by_job.values()]


__all__ = ["JobSpec", "JobLaunchFailed", "launch_job", "relaunch_job", "group_jobs", "summarize", "failed_first",
           "job_state", "node_run_id", "nproc_for", "torchrun_command", "DEFAULT_DIST_TIMEOUT_S"]
