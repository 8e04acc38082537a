"""`watch --headless` heals what a supervisor cannot: a `lost` run (its supervisor is gone: a reboot took it with
the container, or an OOM kill or a stray `kill -9` took it alone) that has a restart policy with restarts left is
started again, once per loss, as a new run of its command (the agent's `relaunch`, which first ends whatever still
runs of the lost one, and refuses a second relaunch of the same loss, from this watcher or another). The bundled
trainer resumes from its newest checkpoint; a plain command runs again as it was.

A multi-node job with a restart policy is relaunched as a whole, never one node alone, once every node has
ended and one of them was lost, or ended with torchrun's worker restarts unspent: its torchrun died (a SIGKILL,
an OOM kill) or gave up on a peer that did, which torchrun's own restarts cannot heal. A job whose workers failed
through every restart, or that a crash loop stopped, is not. All nodes start again under a new job id and resume
from node 0's newest checkpoint (jobs.relaunch_job); each relaunch spends one restart of the job's policy.

Each relaunch is said as a JSON line and as a `restarted` alert, which the notification destinations get like
any other. One that could not be made (the host unreachable, a `pct exec` that failed, a process of the lost run
that outlived SIGKILL) is tried again, 5 s later, then twice as long each time up to 5 minutes, for as long as the
loss is unclaimed; a refusal is final. A loss another watcher healed first is a quiet note (`relaunch_note`, sent
to no destination), not an error.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from dflash_records.protocol import ALREADY_RELAUNCHED, LOST, SURVIVORS_LEFT, iso_utc
from dflash_records.restart import backoff

from ..errors import DflashError, TransportError
from ..alertkinds import ERROR, INFO, RESTARTED, WARNING
from ..runs.client import Relaunched, RelaunchFailed
from ..runs.jobs import relaunch_job
from ..watch.model import AlertFeed, AlertView, RunStatus
from ..watch.source import LiveSource

RETRY_FIRST_S = 5.0  # a relaunch that could not be made is tried again after this, twice as long each time after
RETRY_MAX_S = 300.0  # ...up to this, for as long as the loss is unclaimed
RELAUNCH_NOTE = "relaunch_note"  # the watch's own alert kind: a loss another watcher healed (no destination's)
DONE, AGAIN = True, False
NODE0_CHECKPOINT = "node 0's newest checkpoint"


class Relauncher:
    def __init__(self, source: LiveSource, say: Callable[[dict], None], *,
                 clock: Callable[[], float] = time.monotonic, first_retry_s: float = RETRY_FIRST_S) -> None:
        self.source = source
        self.say = say
        self.clock = clock
        self.first_retry_s = first_retry_s
        self._done: set[tuple[str, str]] = set()  # (target, run id) or ("job", job id): relaunched, or not to be
        self._failed: dict[tuple[str, str], tuple[int, float]] = {}  # failed tries so far, when the next is due

    def __call__(self, feed: AlertFeed) -> None:
        for run in feed.runs.values():
            key = (run.target, run.run_id)
            if run.relaunchable and self._due(key):
                self._settle(key, self.relaunch(run, self._tries(key)))
        for job_id, nodes in jobs_to_relaunch(feed.runs.values()).items():
            key = ("job", job_id)
            if self._due(key):
                self._settle(key, self.relaunch_job(job_id, nodes, self._tries(key)))

    def _due(self, key: tuple[str, str]) -> bool:
        return key not in self._done and self.clock() >= self._failed.get(key, (0, 0.0))[1]

    def _tries(self, key: tuple[str, str]) -> int:
        return self._failed.get(key, (0, 0.0))[0]

    def retry_in(self, failures: int) -> float:
        """Seconds before the next try after `failures` failed ones in a row."""
        return backoff(failures, base=self.first_retry_s, cap=RETRY_MAX_S)

    def _settle(self, key: tuple[str, str], outcome: bool) -> None:
        if outcome is DONE:
            self._done.add(key)
            self._failed.pop(key, None)
            return
        failures = self._tries(key) + 1
        self._failed[key] = (failures, self.clock() + self.retry_in(failures))

    def relaunch(self, run: RunStatus, tries: int) -> bool:
        try:
            target = self.source.inventory.target(run.target)
            started = self.source.client.relaunch(target, run.run_id, name=run.name, grace=run.grace_s)
        except DflashError as exc:
            return self._failure(run, exc, tries, f"lost run {run.run_id}")
        self._tell(run, "relaunched", WARNING,
                   f"restarted: lost run {run.run_id} relaunched as {started.run_id} on {run.target}"
                   f"{resumed(started, 'its newest checkpoint')}{survivors(started)}{at_try(tries)}",
                   new_run_id=started.run_id)
        return DONE

    def relaunch_job(self, job_id: str, nodes: list[RunStatus], tries: int) -> bool:
        head = min(nodes, key=lambda node: node.job.node_rank)
        why = _why_relaunched(nodes)
        try:
            targets = [(self.source.inventory.target(n.target), n.run_id, n.job.node_rank) for n in nodes]
            new_job, started = relaunch_job(self.source.client, targets, head.name, grace=head.grace_s)
        except DflashError as exc:
            return self._failure(head, exc, tries, f"job {job_id} ({why})", job_id=job_id)
        self._tell(head, "relaunched", WARNING,
                   f"restarted: job {job_id} {why}; relaunched on every node as job {new_job}"
                   f"{resumed(started[0], NODE0_CHECKPOINT)}"
                   f"{''.join(survivors(node) for node in started)}{at_try(tries)}", job_id=job_id,
                   new_job_id=new_job)
        return DONE

    def _failure(self, run: RunStatus, exc: DflashError, tries: int, what: str, **extra) -> bool:
        """Say why a relaunch did not start: a quiet note where another watcher healed the loss, an error
        otherwise, with when it is tried again where it may be. DONE when it is not to be tried again."""
        code = exc.code if isinstance(exc, RelaunchFailed) else None
        if code == ALREADY_RELAUNCHED:
            self._tell(run, RELAUNCH_NOTE, INFO, f"{what} not relaunched here: {exc}", kind=RELAUNCH_NOTE, **extra)
            return DONE
        if isinstance(exc, TransportError) or code == SURVIVORS_LEFT:
            again = self.retry_in(tries + 1)
            self._tell(run, "relaunch_failed", ERROR, f"{what} not relaunched: {exc}; trying again in {again:g}s"
                       f"{at_try(tries)}", retry_in_s=again, **extra)
            return AGAIN
        self._tell(run, "relaunch_failed", ERROR, f"{what} not relaunched: {exc}{at_try(tries)}", **extra)
        return DONE

    def _tell(self, run: RunStatus, line_type: str, severity: str, message: str, *, kind: str = RESTARTED,
              **extra) -> None:
        now = iso_utc(timespec="seconds")
        self.say({"type": line_type, "time": now, "run_id": run.run_id, "target": run.target, "name": run.name,
                  "message": message, **extra})
        self.source.note(AlertView(time=now, run_id=run.run_id, target=run.target, kind=kind,
                                   severity=severity, message=message))


def resumed(started: Relaunched, where: str) -> str:
    """What the relaunched command starts from: a checkpoint only where the bundled trainer has one to resume."""
    if not started.resumes:
        return ", running its command again as it was"
    if started.resumes_from:
        return f", resuming from {where} ({started.resumes_from})"
    return ", starting over: no checkpoint to resume from yet"


def survivors(started: Relaunched) -> str:
    if not started.survivors_ended:
        return ""
    pids = ", ".join(map(str, started.survivors_ended))
    return f"; its supervisor had died alone and process(es) {pids} of it still ran: ended first (SIGTERM, " \
        "SIGKILL after its grace where needed)"


def at_try(tries: int) -> str:
    return f" (try {tries + 1})" if tries else ""


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
