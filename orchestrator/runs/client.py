"""The caller of the agent: launch, list, kill and clean up runs, read log lines, start the watch stream (besides
deploy.py, which asks it only to install the trainer package).

Everything that happens inside a container is done by the agent (dflash_agent/), shipped once per version
and invoked over the target's transport with one command per operation (agentcall: its command line and its one
JSON answer). This module decides what to ask where, and parses each answer once, where the call returns, into
its type (dflash_records/answers.py, plans.py): its methods return those, and nothing past them reads an answer or
a run record by key.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Sequence

from dflash_records.answers import (CheckAnswer, KillAnswer, LaunchAnswer, LinesAnswer, NetInfo, PsAnswer,
                                    RelaunchAnswer, SkippedRunDir)
from dflash_records.plans import CleanupAnswer, ProbeAnswer, PullPlan
from dflash_records.protocol import (CHECK_FAILED, DEFAULT_GRACE_S, NO_GPUS, NOT_VERIFIED, QUEUED, SUCCEEDED,
                                     TERMINAL_STATES)
from dflash_records.queueinfo import QueueAnswer
from dflash_records.run import RunRecord
from dflash_records.stepfigures import exact_records, latest_step

from ..errors import EXIT_UNREACHABLE, DflashError, OperationFailed, TransportError
from ..inventory.model import Inventory, Target
from ..trainlog.parser import step_events
from ..transports.base import RemoteProcess, Transport
from ..transports.fanout import Outcome, per_target
from ..transports.pool import Connections
from ..transports.timeouts import AGENT_TIMEOUT_S, CLEANUP_TIMEOUT_S, LAUNCH_TIMEOUT_S, PULL_PLAN_TIMEOUT_S
from . import whereabouts
from .agentcall import agent_answer, checked_agent_argv, needs_deploy
from .command import CONFIG_INPUT, check_command, config_base_dir, retry_args
from .deploy import Deployment, agent_bundle, agent_path_in, deploy, pkg_dir_in, send_trainer
from .gpucheck import check_gpus
from .spec import LaunchSpec, new_run_id, run_dir, runs_dir
from .trainerconfig import judge

PS_TAIL_BYTES = 8192  # enough of a log's end to hold its last step line


class RunClient:
    """All run operations of one dflashctl invocation (deployments are cached per target)."""

    def __init__(self, inventory: Inventory, conns: Connections) -> None:
        self.inventory = inventory
        self.conns = conns
        self._deployed: dict[tuple[str, bool], Deployment] = {}
        # target name -> run directories its agent skipped (symbolic links, never followed), as ps last read them
        self.skipped: dict[str, tuple[SkippedRunDir, ...]] = {}
        # run id -> the live runs of the same name on its target when it was launched (the agent's answer)
        self.namesakes: dict[str, list[str]] = {}
        # run id -> target of every run this client asked to start that may be running now: started, left
        # unverified, or asked for when the answer never came (an interrupted launch says these)
        self.started: dict[str, str] = {}

    # -- agent plumbing -------------------------------------------------------------------------------------

    def _deployment(self, target: Target, transport: Transport, *, with_trainer: bool = False) -> Deployment:
        key = (target.name, with_trainer)
        if key not in self._deployed:
            self._deployed[key] = deploy(transport, target, with_trainer=with_trainer)
        return self._deployed[key]

    def deploy(self, target: Target, *, with_trainer: bool) -> Deployment:
        """Ship the agent (and the trainer) to the target now, once per version and dflashctl invocation."""
        return self._deployment(target, self.conns.for_target(target), with_trainer=with_trainer)

    def agent(self, target: Target, args: list[str], *, timeout: float | None = None, stdin: bytes | None = None,
              with_trainer: bool = False) -> dict:
        """Run one agent subcommand on the target and return its JSON answer (ok true or false) as it came: the
        methods below parse it into its type at once, and nothing else reads it; the timeout is
        AGENT_TIMEOUT_S unless given, and a command past it is ended on the target (CommandTimeout, exit 3).
        One remote command when this version of the agent is there (the call checks it, agentcall.py); the
        agent is sent and the call made again only when it is not."""
        transport = self.conns.for_target(target)
        limit = AGENT_TIMEOUT_S if timeout is None else timeout
        if with_trainer:  # the trainer's package is checked and leased in the same call (deploy.py)
            args = [args[0], "--lease-pkg", pkg_dir_in(target.workdir), *args[1:]]
        sent: set[str] = set()
        while True:
            payload = agent_answer(target, transport.run(self._checked_argv(target, args), stdin=stdin,
                                                         timeout=limit))
            if not needs_deploy(payload):
                return payload
            missing = "pkg" if payload.get("pkg") else "agent"
            if missing in sent:
                raise TransportError(f"{target.name}: the {'trainer' if missing == 'pkg' else 'agent'} is still "
                                     f"not there ({payload.get(missing)}) right after it was sent")
            sent.add(missing)
            if missing == "agent":
                self._redeploy(target, transport)
            else:
                send_trainer(transport, target)

    def start_agent(self, target: Target, args: list[str]) -> RemoteProcess:
        """Start a streaming agent subcommand (`watch`), checked as `agent` checks it: its first line may be the
        NEEDS_DEPLOY answer (agentcall.needs_deploy), after which the caller has it sent (`redeploy`) and
        starts it again."""
        return self.conns.for_target(target).start(self._checked_argv(target, args))

    def redeploy(self, target: Target) -> Deployment:
        """Send the agent now, whatever this invocation sent before (a container may have been replaced)."""
        return self._redeploy(target, self.conns.for_target(target))

    def _redeploy(self, target: Target, transport: Transport) -> Deployment:
        self._deployed.pop((target.name, False), None)
        return self._deployment(target, transport)

    @staticmethod
    def _checked_argv(target: Target, args: list[str]) -> list[str]:
        agent = agent_bundle()
        return checked_agent_argv(target, agent_path_in(target.workdir), len(agent.data), agent.sha256, *args)

    # -- operations -----------------------------------------------------------------------------------------

    def check_trainer_config(self, target: Target, config_text: bytes, *, source: str,
                             env: dict[str, str]) -> dict:
        """The bundled trainer's own check of the config on the target, on its own, in the environment `env` a
        run would get (a job checks every node before it starts any); ConfigRejected when it refuses the config.
        `source` is the config file's path here, which places its relative paths (command.config_base_dir)."""
        args = ["check", "--pythonpath", pkg_dir_in(target.workdir)]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        argv = check_command(target, base_dir=config_base_dir(target, source), source=source)
        answer = CheckAnswer.from_dict(self.agent(target, [*args, "--", *argv], timeout=LAUNCH_TIMEOUT_S,
                                                  stdin=config_text, with_trainer=True))
        return judge(target, source, answer.check)

    def launch(self, spec: LaunchSpec) -> RunRecord:
        """Start the run, or (spec.queued()) have it wait in the container's queue while its GPUs are held: the
        record returned is then `queued`, with its place in the queue, and nothing of it runs yet."""
        check_gpus(lambda: self.conns.for_target(spec.target), spec.target, gpus=spec.gpus, gpu_count=spec.gpu_count)
        run_id = spec.run_id or new_run_id(spec.name)
        args = ["launch", "--runs-dir", runs_dir(spec.target), "--run-id", run_id, "--name", spec.name,
                "--target", spec.target.name, "--grace", f"{spec.grace:g}"]
        if spec.uses_trainer:
            args += ["--pythonpath", pkg_dir_in(spec.target.workdir)]
        for key, value in spec.run_env().items():
            args += ["--env", f"{key}={value}"]
        if spec.gpus is not None:
            args += ["--gpus", ",".join(map(str, spec.gpus)) or NO_GPUS]
        if spec.gpu_count is not None:
            args += ["--gpu-count", str(spec.gpu_count)]
        if spec.queued():
            args.append("--queue")
        if spec.force:
            args.append("--force")
        if spec.settle is not None:
            args += ["--settle", f"{spec.settle:g}"]
        if spec.job:
            args += ["--job-id", spec.job.job_id, "--node-rank", str(spec.job.node_rank),
                     "--nnodes", str(spec.job.nnodes)]
        if spec.sweep:
            args += ["--sweep-id", spec.sweep.sweep_id, "--sweep-values", json.dumps(spec.sweep.values)]
        for name in spec.inputs:
            args += ["--input", name]
        args += restart_args(spec)
        if spec.check_config is not None:  # the agent runs it before it creates anything
            argv = check_command(spec.target, base_dir=spec.config_base or run_dir(spec.target, run_id),
                                 source=spec.check_config)
            args += ["--check", json.dumps(argv), "--check-input", CONFIG_INPUT]
        self.started[run_id] = spec.target.name
        answer = LaunchAnswer.from_dict(self.agent(spec.target, [*args, "--", *spec.command],
                                                   timeout=LAUNCH_TIMEOUT_S,
                                                   stdin=_pack_inputs(spec.inputs) if spec.inputs else None,
                                                   with_trainer=spec.uses_trainer))
        return self._launched(spec, run_id, answer)

    def _launched(self, spec: LaunchSpec, run_id: str, answer: LaunchAnswer) -> RunRecord:
        """The record of a run the agent answered for; LaunchUnverified for one it started but could not see
        running in time (left running), LaunchFailed for one that ended or never started."""
        record = answer.run or RunRecord()
        # finishing at once with 0 is no failure, and a run the agent queued is recorded: it will start
        if answer.ok or record.state in (SUCCEEDED, QUEUED):
            whereabouts.remember([(spec.target.name, record)])
            self.namesakes[record.run_id or run_id] = list(answer.namesakes or ())
            return with_metrics(record)
        if answer.code == NOT_VERIFIED and record.run_id and record.state not in TERMINAL_STATES:
            whereabouts.remember([(spec.target.name, record)])  # a kill of it then asks its own target
            raise LaunchUnverified(answer, spec.target.name)
        self.started.pop(run_id, None)
        if answer.code == CHECK_FAILED and answer.check is not None:
            judge(spec.target, spec.check_config or CONFIG_INPUT, answer.check)
        raise LaunchFailed(answer, spec.target.name)

    def relaunch(self, target: Target, run_id: str, *, name: str, new_id: str | None = None,
                 job_id: str | None = None, grace: float | None = None) -> Relaunched:
        """Start a lost run with restarts left again as a new run (the agent refuses a second relaunch of the
        same loss, and first ends what still runs of the lost one, within its `grace`), or a node of a job as
        run `new_id` of job `job_id` (jobs.relaunch_job). RelaunchFailed says why not, with the agent's code."""
        new_id = new_id or new_run_id(name or run_id)
        answer = RelaunchAnswer.from_dict(self.agent(
            target, ["relaunch", "--runs-dir", runs_dir(target), "--run-id", run_id, "--new-run-id", new_id,
                     *(["--job-id", job_id] if job_id else [])],
            timeout=LAUNCH_TIMEOUT_S + (DEFAULT_GRACE_S if grace is None else grace)))
        if not answer.ok:
            raise RelaunchFailed(f"{target.name}: {answer.error or 'relaunch failed'}", code=answer.code)
        return Relaunched(with_metrics(answer.run or RunRecord()), answer.resumes_from, bool(answer.resume_args),
                          tuple(answer.survivors_ended))

    def list_runs(self, targets: list[Target]) -> list[Outcome[list[RunRecord]]]:
        outcomes = per_target(targets, lambda target: self.runs_on(target, tail_bytes=PS_TAIL_BYTES))
        whereabouts.remember((o.target.name, record) for o in outcomes for record in o.value or [])
        return outcomes

    def runs_on(self, target: Target, run_ids: Sequence[str] = (), *, tail_bytes: int = 0) -> list[RunRecord]:
        """The records of the target's runs (or of the named ones), with last step and tok/s when a tail is read."""
        return [with_metrics(record, tail, exact)
                for record, tail, exact in self.runs_with_tails(target, run_ids, tail_bytes=tail_bytes)]

    def runs_with_tails(self, target: Target, run_ids: Sequence[str] = (), *,
                        tail_bytes: int = 0) -> list[tuple[RunRecord, str | None, str | None]]:
        """Each run's record with the end of its log and of its metrics.jsonl (None where not read)."""
        args = ["ps", "--runs-dir", runs_dir(target)]
        for run_id in run_ids:
            args += ["--run-id", run_id]
        if tail_bytes:
            args += ["--tail-bytes", str(tail_bytes)]
        answer = PsAnswer.from_dict(self.agent(target, args))
        if not answer.ok:  # never "no runs" for runs the agent could not read
            raise OperationFailed(f"{target.name}: {answer.error or 'the agent could not list the runs'}")
        self.skipped[target.name] = answer.skipped
        tails = answer.log_tails or (None,) * len(answer.runs)
        metrics = answer.metrics_tails or (None,) * len(answer.runs)
        return list(zip(answer.runs, tails, metrics))

    def log_lines(self, target: Target, run_id: str, start: int, stop: int) -> LinesAnswer:
        """Lines [start, stop) of a run's log and its line count (`total`)."""
        answer = LinesAnswer.from_dict(self.agent(target, ["lines", "--runs-dir", runs_dir(target), "--run-id",
                                                           run_id, "--start", str(start), "--stop", str(stop)]))
        if not answer.ok:
            raise TransportError(f"{target.name}: {answer.error or 'lines failed'}")
        return answer

    def queue(self, target: Target) -> QueueAnswer:
        """The container's GPU queue: its GPUs (free, ours, a foreign process's) and its queued runs in order, as
        the agent answered (ok false with `error` where it could not read them)."""
        return QueueAnswer.from_dict(self.agent(target, ["queue", "--runs-dir", runs_dir(target)]))

    def kill(self, target: Target, run_ids: list[str], *, grace: float | None) -> KillAnswer:
        args = ["kill", "--runs-dir", runs_dir(target), "--run-id", *run_ids]
        if grace is not None:
            args += ["--grace", f"{grace:g}"]
        return KillAnswer.from_dict(self.agent(target, args, timeout=(grace or DEFAULT_GRACE_S) + AGENT_TIMEOUT_S))

    def netinfo(self, target: Target, toward: str, *, free_port: bool = False) -> NetInfo:
        """The target's local address and interface toward `toward`, and a free TCP port there if asked."""
        answer = NetInfo.from_dict(self.agent(target, ["netinfo", "--toward", toward]
                                              + (["--free-port"] if free_port else [])))
        if not answer.ok:
            raise OperationFailed(f"{target.name}: {answer.error or 'netinfo failed'}")
        return answer

    def cleanup(self, target: Target, *, dry_run: bool) -> CleanupAnswer:
        args = ["cleanup", "--runs-dir", runs_dir(target)] + (["--dry-run"] if dry_run else [])
        return CleanupAnswer.from_dict(self.agent(target, args, timeout=CLEANUP_TIMEOUT_S))

    def probe(self, target: Target, args: list[str]) -> ProbeAnswer:
        """The agent's probe (doctor's facts), its options `args`."""
        return ProbeAnswer.from_dict(self.agent(target, ["probe", *args], timeout=AGENT_TIMEOUT_S))

    def pull_plan(self, target: Target, args: list[str]) -> PullPlan:
        """What `pull` fetches of a run (pull-plan's options `args`); OperationFailed when the agent cannot say."""
        answer = PullPlan.from_dict(self.agent(target, ["pull-plan", *args], timeout=PULL_PLAN_TIMEOUT_S))
        if not answer.ok:
            raise OperationFailed(f"{target.name}: {answer.error or 'the agent could not list the files'}")
        return answer


class LaunchFailed(OperationFailed):
    """The run ended (or never started) during verification; carries the agent's answer."""

    def __init__(self, answer: LaunchAnswer, target: str) -> None:
        self.answer = answer
        super().__init__(f"{target}: {answer.error or 'the run did not start'}")


class LaunchUnverified(DflashError):
    """The run was started but not seen running within the agent's verify bound (a loaded target answers
    slowly): it is left running, not stopped, and a launch says so with its id (exit 3: what became of it is
    not known, as of a target that did not answer), never that it failed: a user who launched a "failed" run
    again would have two."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, answer: LaunchAnswer, target: str) -> None:
        self.answer = answer
        self.run = answer.run or RunRecord()
        self.run_id = self.run.run_id
        self.said = str(answer.error or f"run {self.run_id} could not be verified running")  # the agent's
        super().__init__(f"{target}: {self.said}, but it was started and is left running ({_not_yet(self.run)}): "
                         f"`dflashctl ps {target}` shows what became of it, `dflashctl kill {self.run_id}` stops it "
                         f"(launching it again would start a second copy)")


def _not_yet(record: RunRecord) -> str:
    """How far the run had got when the agent gave up waiting."""
    if record.pid:
        return f"{record.state}, pid {record.pid}"
    return f"{record.state or 'starting'}, its workload not yet started"


class RelaunchFailed(OperationFailed):
    """A relaunch that did not start, with the agent's code: ALREADY_RELAUNCHED (another watcher healed the
    loss), SURVIVORS_LEFT (nothing started: worth another try), NOT_RELAUNCHED (refused), or a launch's."""

    def __init__(self, message: str, *, code: str | None) -> None:
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class Relaunched:
    """What a relaunch started: the new run's record, the checkpoint it resumes from (the lost run's newest; None
    without one), whether it resumes at all (the bundled trainer's `--resume auto`; a plain command is run again
    as it was), and the lost run's processes that still ran and were ended first."""

    record: RunRecord
    resumes_from: str | None
    resumes: bool
    survivors_ended: tuple[int, ...] = ()

    @property
    def run_id(self) -> str | None:
        return self.record.run_id or None


def restart_args(spec: LaunchSpec) -> list[str]:
    """The agent's options for the run's restart policy, its backoff, its hang watchdog and what a restarted
    attempt appends to the command (`--retry-arg=--resume`: an argument that starts with `--` needs the `=`)."""
    args = ["--restart", spec.restart_policy()]
    if spec.restart_backoff is not None:
        args += ["--restart-backoff", f"{spec.restart_backoff:g}"]
    if spec.hang_timeout is not None:
        args += ["--hang-timeout", f"{spec.hang_timeout:g}"]
    if spec.worker_restarts:
        args += ["--worker-restarts", str(spec.worker_restarts)]
    return args + [f"--retry-arg={arg}" for arg in retry_args(spec.command)]


def _pack_inputs(inputs: dict[str, bytes]) -> bytes:
    """The inputs as one JSON document on the agent's stdin (small files: configs)."""
    return json.dumps({name: base64.b64encode(data).decode() for name, data in inputs.items()}).encode()


def with_metrics(record: RunRecord, tail: str | None = None, metrics: str | None = None) -> RunRecord:
    """The record with last_step and tok_per_s from the log and metrics.jsonl tails the agent sent along (ps
    --tail-bytes): the last step line's, with its metrics.jsonl figures where they came (stepfigures.latest_step,
    the rule every view reads a step's figures by). An agent of the last version sends no metrics tail."""
    lines = step_events(tail)
    exact = exact_records(metrics)
    line = lines[-1] if lines else None
    latest = latest_step(line, exact)
    if latest is not None:
        return record.with_figures(latest.step, latest.tok_per_s)
    return record


__all__ = ["RunClient", "LaunchFailed", "LaunchUnverified", "RelaunchFailed", "Relaunched", "with_metrics"]
