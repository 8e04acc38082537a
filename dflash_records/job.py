"""A multi-node job as its node runs sum it up: `ps`'s job object (JobSummary) and what a launch of one started
(LaunchedJob). The controller computes them from the node records (orchestrator/runs/jobs.py); their JSON is
`ps --json`'s and `launch --json`'s, whose keys may be added to, never renamed."""
from __future__ import annotations

from dataclasses import dataclass

from .run import RunRecord
from .wire import WireRecord, each, encode, extra_keys, of


@dataclass(frozen=True)
class FirstFailure(WireRecord):
    """The node that failed first (the earliest end among failed or lost nodes), and why, in one line."""

    node_rank: int | None = None
    target: str | None = None
    run_id: str | None = None
    state: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    ended_at: str | None = None
    reason: str = ""
    extra: dict = extra_keys()


@dataclass(frozen=True)
class JobSummary(WireRecord):
    """A job's state (running while a node lives, else failed, killed or succeeded), its nodes sorted by rank, and
    node 0's step figures (its log is the job's)."""

    job_id: str | None = None
    name: str | None = None
    state: str | None = None
    nnodes: int = 0
    targets: tuple = each()
    created_at: str | None = None
    ended_at: str | None = None
    last_step: int | None = None
    tok_per_s: float | None = None
    failed_first: FirstFailure | None = of(FirstFailure, optional=True)
    relaunched_as: str | None = None
    nodes: tuple = each(RunRecord)
    extra: dict = extra_keys()


    def to_dict(self) -> dict:
        out = encode(self)
        out["nodes"] = [self.node_dict(node) for node in self.nodes]
        return out

    def node_dict(self, node: RunRecord) -> dict:
        """A node's record as `ps --json` lists it: with its job's state and the rank of the node that failed first."""
        return dict(node.to_dict(), job_state=self.state,
                    job_failed_first=self.failed_first.node_rank if self.failed_first else None)


@dataclass(frozen=True)
class LaunchedJob:
    """What `launch` of a job started: its id, name and rendezvous endpoint, its state, one record per node."""

    job_id: str
    name: str
    rendezvous: str
    state: str
    nodes: tuple = each(RunRecord)

    def to_dict(self) -> dict:
        return encode(self)


__all__ = ["FirstFailure", "JobSummary", "LaunchedJob"]
