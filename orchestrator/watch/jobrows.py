"""Fold the node runs of a multi-node job into one dashboard row: rank 0's log and metrics are the job's, its
state and first failure those jobs.summarize gives `ps` too."""
from __future__ import annotations

import dataclasses

from dflash_records.run import RunRecord

from ..runs.jobs import summarize
from .model import NodeView, RunView


def fold_jobs(runs: list[tuple[RunRecord, RunView]]) -> tuple[list[RunView], dict[str, list[RunView]]]:
    """(rows, members): plain runs as they are plus one row per job, and each job's node views by job id."""
    rows: list[RunView] = []
    members: dict[str, list[tuple[RunRecord, RunView]]] = {}
    for run, view in runs:
        if run.job_id:
            members.setdefault(run.job_id, []).append((run, view))
        else:
            rows.append(view)
    for job_id, nodes in members.items():
        nodes.sort(key=lambda node: node[0].node_rank or 0)
        rows.append(_job_row(job_id, nodes))
    rows.sort(key=lambda v: (v.created_at or "", v.run_id))
    return rows, {job_id: [view for _, view in nodes] for job_id, nodes in members.items()}


def _job_row(job_id: str, nodes: list[tuple[RunRecord, RunView]]) -> RunView:
    job = summarize([run for run, _ in nodes])
    head = nodes[0][1]
    first_id = job.failed_first.run_id if job.failed_first else None
    failed_node = next((v for r, v in nodes if first_id and r.run_id == first_id), None)
    views = [view for _, view in nodes]
    return dataclasses.replace(
        head,
        run_id=job_id,
        target="+".join(v.target for v in views),
        state=job.state,
        exit_code=failed_node.exit_code if failed_node else head.exit_code,
        signal=failed_node.signal if failed_node else head.signal,
        created_at=min((v.created_at or "" for v in views), default="") or None,
        ended_at=None if any(v.ended_at is None for v in views) else max(v.ended_at or "" for v in views),
        exceptions=sum(v.exceptions for v in views),
        exception_texts=tuple(t for v in views for t in v.exception_texts),
        nodes=tuple(NodeView(run_id=v.run_id, target=v.target, node_rank=r.node_rank or 0, state=v.state,
                             pid=v.pid, exit_code=v.exit_code, signal=v.signal) for r, v in nodes),
    )
