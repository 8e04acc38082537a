"""`relaunch`: start a `lost` run again (its container rebooted under it) as a new run of the same command,
once per loss, when its restart policy has restarts left.

The lost run keeps its terminal state (every run ends exactly once); it records which run took over
(`relaunched_as`, written under its lock before anything starts: a second watcher, or a second look by the same
one, finds it and starts nothing). The new run works where the lost one worked (its cwd, so a relative output
directory and its config are the same files), gets the restarts that were left, and, as any restarted attempt,
the retry arguments from its first attempt on: the bundled trainer resumes from its newest complete checkpoint.

Nothing of the lost run may still run when its successor starts: on `local`, on a plain SSH host, or under an OOM
kill or a stray `kill -9`, the supervisor can die alone while its workload lives on under the keeper, still
writing into the same output directory (and holding the same GPUs). So before the claim, what is left of it is
ended as `kill` ends leftovers (TERM, the run's grace, KILL); the answer names them (`survivors_ended`), and one
that even SIGKILL does not end means nothing is claimed or started (code survivors_left: the caller tries again
later). A refused loss is left alone, processes and all.

A node of a multi-node job is never relaunched alone: the controller relaunches a job as a whole, every node
under the new job id it names (`--job-id`), once its nodes have all ended and one of them was lost or its
torchrun died. So a node's relaunch takes `failed` as well as `lost`, never `killed` or `succeeded`, never a crash
loop, and only under the job's restart policy (torchrun's worker restarts), each relaunch spending one of them
(`job_relaunches`). Node 0 is claimed first: its `relaunched_as` is the job's claim, and a second watcher stops
there.
"""
from __future__ import annotations

from dflash_records.answers import RelaunchAnswer
from dflash_records.protocol import (ALREADY_RELAUNCHED, DEFAULT_GRACE_S, FAILED, LOST, NO_GPUS, NOT_RELAUNCHED,
                                     SURVIVORS_LEFT, iso_utc)
from dflash_records.restart import CRASH_LOOP, NEVER, ON_FAILURE, job_relaunches_left, max_attempts

from . import kill, pullplan
from .errors import BadInput, OperationFailed
from .launch import LaunchRequest, job_fields, launch
from .rundir import RunPaths, existing_run
from .runstate import read_run, read_state, settle_liveness, update_state


def refusal(run: dict, state: dict, new_job_id: str | None = None) -> str | None:
    """Why this run is not relaunched (as a node of job `new_job_id` when given), or None when it is to be."""
    policy = run.get("restart") or {}
    if state.get("relaunched_as"):
        return "already relaunched as {}".format(state["relaunched_as"])
    if run.get("job_id"):
        return _node_refusal(run, state, new_job_id)
    if new_job_id is not None:
        return "it is not a node of a multi-node job"
    if state.get("state") != LOST:
        return "run is {}, not lost".format(state.get("state"))
    if policy.get("policy") != ON_FAILURE:
        return "it has no restart policy"
    if len(state.get("attempts") or []) >= max_attempts(policy):
        return "its restarts are used up"
    return None


def _node_refusal(run: dict, state: dict, new_job_id: str | None) -> str | None:
    if new_job_id is None:
        return "a node of job {} restarts with its job, not alone".format(run["job_id"])
    if state.get("state") not in (LOST, FAILED):
        return "node {} of job {} is {}: a job is relaunched after a loss or a failure, never after a kill or " \
               "its end".format(run.get("node_rank"), run["job_id"], state.get("state"))
    if not run.get("worker_restarts"):
        return "job {} has no restart policy".format(run["job_id"])
    if state.get("reason") == CRASH_LOOP:
        return "node {} of job {} ended in a crash loop: {}".format(run.get("node_rank"), run["job_id"],
                                                                    state.get("error") or "the same failure")
    if job_relaunches_left(run.get("worker_restarts"), run.get("job_relaunches")) < 1:
        return "job {}'s relaunches are used up ({} of {})".format(run["job_id"], run.get("job_relaunches"),
                                                                  run["worker_restarts"])
    return None


def refuse(paths: RunPaths, run: dict, state: dict, new_job_id: str | None) -> None:
    """OperationFailed saying why, when this loss is not to be relaunched: code already_relaunched where it was
    (another watcher's, or an earlier try's, relaunch took it), not_relaunched otherwise."""
    reason = refusal(run, state, new_job_id)
    if reason is not None:
        raise OperationFailed("{} not relaunched: {}".format(paths.run_id, reason),
                              code=ALREADY_RELAUNCHED if state.get("relaunched_as") else NOT_RELAUNCHED,
                              details={"relaunched_as": state.get("relaunched_as")})


def end_survivors(paths: RunPaths, new_job_id: str | None = None) -> list:
    """End what is still running of a loss to be relaunched (see the module's docstring): the pids ended."""
    state, _ = settle_liveness(paths)  # a run whose supervisor is gone becomes `lost` here first
    run = read_run(paths)
    refuse(paths, run, state, new_job_id)
    grace = float(run.get("grace_s", DEFAULT_GRACE_S))
    ended, survived, _ = kill.end_run_processes(paths, state, grace)
    if survived:
        raise OperationFailed("{} not relaunched yet: process(es) {} of it survived SIGKILL".format(
            paths.run_id, ", ".join(map(str, survived))), code=SURVIVORS_LEFT, details={"survivors": survived})
    return ended


def claim_loss(paths: RunPaths, new_run_id: str, new_job_id: str | None = None, *, ended: list = ()) -> tuple:
    """(run, state) once this caller owns the relaunch of the loss; OperationFailed saying why not otherwise.
    `ended`: the pids of the run a relaunch ended first, which its record then mentions."""
    settle_liveness(paths)  # a run whose supervisor is gone becomes `lost` here first
    run, refused = read_run(paths), []

    def mutate(state: dict):
        if refusal(run, state, new_job_id) is not None:
            refused.append(dict(state))
            return None
        state.update(relaunched_as=new_run_id, relaunched_at=iso_utc())
        if ended:
            state["error"] = "{}; process(es) {} of it still ran and were ended before its relaunch".format(
                state.get("error") or "supervisor gone", ", ".join(map(str, ended)))
        attempts = state.get("attempts") or []
        if attempts and not attempts[-1].get("reason"):  # the attempt the reboot took
            attempts[-1].update(reason=LOST, ended_at=state.get("ended_at"))
        return state
    state = update_state(paths, mutate)
    if refused:
        refuse(paths, run, refused[0], new_job_id)
    return run, state


def request_for(paths: RunPaths, run: dict, state: dict, new_run_id: str,
                new_job_id: str | None = None) -> LaunchRequest:
    gpus = run.get("gpus")
    gpus_text = None if gpus is None else (",".join(map(str, gpus)) or NO_GPUS)
    restart = {"restart": _policy_left(run, state), "restart_backoff_s": run.get("restart_backoff_s"),
               "hang_timeout_s": run.get("hang_timeout_s"), "retry_args": run.get("retry_args") or [],
               "relaunch_of": paths.run_id, "worker_restarts": run.get("worker_restarts") or 0}
    job = None
    if new_job_id is not None:
        job = job_fields(new_job_id, run.get("node_rank"), run.get("nnodes"))
        restart["job_relaunches"] = int(run.get("job_relaunches") or 0) + 1
    return LaunchRequest(job=job, runs_dir=paths.runs_dir, run_id=new_run_id, name=run.get("name") or paths.run_id,
                         target=run.get("target") or "?", command=run["command"], cwd=run.get("cwd"),
                         env_pairs=["{}={}".format(k, v) for k, v in sorted((run.get("env") or {}).items())],
                         gpus=gpus_text, force=False, grace=float(run.get("grace_s") or 0), restart=restart,
                         pythonpath=run.get("pythonpath") or [],
                         sweep={"sweep_id": run.get("sweep_id"), "sweep_values": run.get("sweep_values")})


def _policy_left(run: dict, state: dict) -> dict:
    """The new run's policy: the restarts its lost run had left; a job node's stays `never` (torchrun restarts
    the job's workers, with the count its run record keeps)."""
    policy = run.get("restart") or {}
    if run.get("job_id"):
        return {"policy": NEVER, "max_restarts": 0}
    left = max(int(policy.get("max_restarts") or 0) - len(state.get("attempts") or []), 0)
    return {"policy": ON_FAILURE, "max_restarts": left}


def relaunch(runs_dir: str, run_id: str, new_run_id: str, *, verify_timeout: float, settle: float,
             new_job_id: str | None = None) -> RelaunchAnswer:
    paths = existing_run(runs_dir, run_id)
    if new_run_id == run_id:
        raise BadInput("the new run id must differ from the lost one", code="bad_usage")
    ended = end_survivors(paths, new_job_id)
    run, state = claim_loss(paths, new_run_id, new_job_id, ended=ended)
    # after the survivors ended: a trainer saves a checkpoint on SIGTERM
    resumes_from = pullplan.newest_checkpoint(paths.dir) if run.get("retry_args") else None
    answer = launch(request_for(paths, run, state, new_run_id, new_job_id), verify_timeout=verify_timeout,
                    settle=settle)
    return RelaunchAnswer(ok=True, run=answer.run, relaunched_from=run_id, lost=read_state(paths).get("state"),
                          survivors_ended=tuple(ended), resume_args=tuple(run.get("retry_args") or ()),
                          resumes_from=resumes_from, namesakes=answer.namesakes)
