"""`relaunch`: start a `lost` run again (its container rebooted under it) as a new run of the same command,
once per loss, when its restart policy has restarts left.

The lost run keeps its terminal state (every run ends exactly once); it records which run took over
(`relaunched_as`, written under its lock before anything starts: a second watcher, or a second look by the same
one, finds it and starts nothing). The new run works where the lost one worked (its cwd, so a relative output
directory and its config are the same files), gets the restarts that were left, and, as any restarted attempt,
the retry arguments from its first attempt on: the bundled trainer resumes from its newest complete checkpoint.

A node of a multi-node job is never relaunched alone: the controller relaunches a job as a whole, every node
under the new job id it names (`--job-id`), once its nodes have all ended and one of them was lost or its
torchrun died. So a node's relaunch takes `failed` as well as `lost`, never `killed` or `succeeded`, never a crash
loop, and only under the job's restart policy (torchrun's worker restarts), each relaunch spending one of them
(`job_relaunches`). Node 0 is claimed first: its `relaunched_as` is the job's claim, and a second watcher stops
there.
"""
from __future__ import annotations

from .errors import BadInput, OperationFailed
from .launch import LaunchRequest, job_fields, launch
from .protocol import FAILED, LOST, NO_GPUS, iso_utc
from .restart import CRASH_LOOP, NEVER, ON_FAILURE, job_relaunches_left, max_attempts
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


def claim_loss(paths: RunPaths, new_run_id: str, new_job_id: str | None = None) -> tuple:
    """(run, state) once this caller owns the relaunch of the loss; OperationFailed saying why not otherwise."""
    settle_liveness(paths)  # a run whose supervisor is gone becomes `lost` here first
    run, why = read_run(paths), []

    def mutate(state: dict):
        reason = refusal(run, state, new_job_id)
        if reason is not None:
            why.append(reason)
            return None
        state.update(relaunched_as=new_run_id, relaunched_at=iso_utc())
        attempts = state.get("attempts") or []
        if attempts and not attempts[-1].get("reason"):  # the attempt the reboot took
            attempts[-1].update(reason=LOST, ended_at=state.get("ended_at"))
        return state
    state = update_state(paths, mutate)
    if why:
        raise OperationFailed("{} not relaunched: {}".format(paths.run_id, why[0]), code="not_relaunched")
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
                         pythonpath=run.get("pythonpath") or [])


def _policy_left(run: dict, state: dict) -> dict:
    """The new run's policy: the restarts its lost run had left; a job node's stays `never` (torchrun restarts
    the job's workers, with the count its run record keeps)."""
    policy = run.get("restart") or {}
    if run.get("job_id"):
        return {"policy": NEVER, "max_restarts": 0}
    left = max(int(policy.get("max_restarts") or 0) - len(state.get("attempts") or []), 0)
    return {"policy": ON_FAILURE, "max_restarts": left}


def relaunch(runs_dir: str, run_id: str, new_run_id: str, *, verify_timeout: float, settle: float,
             new_job_id: str | None = None) -> dict:
    paths = existing_run(runs_dir, run_id)
    if new_run_id == run_id:
        raise BadInput("the new run id must differ from the lost one", code="bad_usage")
    run, state = claim_loss(paths, new_run_id, new_job_id)
    answer = launch(request_for(paths, run, state, new_run_id, new_job_id), verify_timeout=verify_timeout,
                    settle=settle)
    return {"ok": True, "relaunched_from": run_id, "lost": read_state(paths).get("state"), **answer}
