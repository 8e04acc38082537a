"""`watch --headless` heals what a supervisor cannot: a run lost with its container (a reboot took the
supervisor too) that has a restart policy with restarts left is started again, once per loss, as a new run of
its command that resumes from its newest checkpoint (the agent's `relaunch`, which also refuses a second
relaunch of the same loss, from this watcher or another).

A multi-node job with a restart policy is relaunched as a whole, never one node alone, once every node has
ended and one of them was lost, or ended with torchrun's worker restarts unspent: its torchrun died (a SIGKILL,
an OOM kill) or gave up on a peer that did, which torchrun's own restarts cannot heal. A job whose workers failed
through every restart, or that a crash loop stopped, is not. All nodes start again under a new job id and resume
from node 0's newest checkpoint (jobs.relaunch_job); each relaunch spends one restart of the job's policy.

Each relaunch is said as a JSON line and as a `restarted` alert, which the notification destinations get like
any other.
"""
from __future__ import annotations

from collections.abc import Callable

from dflash_records.run import RunRecord

from ..errors import DflashError
from ..alertkinds import ERROR, RESTARTED, WARNING
from ..runs.jobs import relaunch_job
from ..watch.model import AlertFeed, AlertView, RunStatus
from ..watch.source import LiveSource
from ..agent.protocol import LOST, iso_utc


class Relauncher:
    def __init__(self, source: LiveSource, say: Callable[[dict], None]) -> None:
        self.source = source
        self.say = say
        self._tried: set[tuple[str, str]] = set()  # (target, run id): one try per loss from this watcher

    def __call__(self, feed: AlertFeed) -> None:
        for run in feed.runs.values():
            if run.relaunchable and (run.target, run.run_id) not in self._tried:
                self._tried.add((run.target, run.run_id))
                self.relaunch(run)
        for job_id, nodes in jobs_to_relaunch(feed.runs.values()).items():
            if ("job", job_id) not in self._tried:
                self._tried.add(("job", job_id))
                self.relaunch_job(job_id, nodes)

    def relaunch(self, run: RunStatus) -> None:
        try:
            target = self.source.inventory.target(run.target)
            record = self.source.client.relaunch(target, run.run_id, name=run.name)
        except DflashError as exc:
            self._tell(run, "relaunch_failed", ERROR, f"lost run {run.run_id} not relaunched: {exc}")
            return
        new_id = RunRecord.from_dict(record).run_id or None  # an agent that sent no record: said as null
        self._tell(run, "relaunched", WARNING,
                   f"restarted: lost run {run.run_id} relaunched as {new_id} on {run.target}, resuming from its "
                   f"newest checkpoint", new_run_id=new_id)

    def relaunch_job(self, job_id: str, nodes: list[RunStatus]) -> None:
        head = min(nodes, key=lambda node: node.job.node_rank)
        why = _why_relaunched(nodes)
        try:
            targets = [(self.source.inventory.target(n.target), n.run_id, n.job.node_rank) for n in nodes]
            new_job, _ = relaunch_job(self.source.client, targets, head.name)
        except DflashError as exc:
            self._tell(head, "relaunch_failed", ERROR, f"job {job_id} ({why}) not relaunched: {exc}",
                       job_id=job_id)
            return
        self._tell(head, "relaunched", WARNING,
                   f"restarted: job {job_id} {why}; relaunched on every node as job {new_job}, resuming "
                   f"from node 0's newest checkpoint", job_id=job_id, new_job_id=new_job)

    def _tell(self, run: RunStatus, line_type: str, severity: str, message: str, **extra) -> None:
        now = iso_utc(timespec="seconds")
        self.say({"type": line_type, "time": now, "run_id": run.run_id, "target": run.target, "name": run.name,
                  "message": message, **extra})
        self.source.note(AlertView(time=now, run_id=run.run_id, target=run.target, kind=RESTARTED,
                                   severity=severity, message=message))


def jobs_to_relaunch(runs) -> dict[str, list[RunStatus]]:
    """The jobs to relaunch, by job id: every node seen, every one ended and relaunchable, and one of them lost or
    ended with torchrun's worker restarts unspent."""
    nodes: dict[str, list[RunStatus]] = {}
    for run in runs:
        if run.job is not None:
            nodes.setdefault(run.job.job_id, []).append(run)
    return {job_id: members for job_id, members in nodes.items()
            if len({m.job.node_rank for m in members}) == members[0].job.nnodes
            and all(m.job.relaunchable for m in members)
            and any(m.state == LOST or m.job.restarts_unspent for m in members)}


def _why_relaunched(nodes: list[RunStatus]) -> str:
    """What ended the job, as the relaunch says it: the nodes lost, else those whose torchrun ended early."""
    lost = [n for n in nodes if n.state == LOST]
    if lost:
        return "lost " + ", ".join(f"node {n.job.node_rank} ({n.target})" for n in lost)
    early = [n for n in nodes if n.job.restarts_unspent]
    return "failed: the torchrun of " + ", ".join(f"node {n.job.node_rank} ({n.target})" for n in early) + \
        " ended with worker restarts left"
