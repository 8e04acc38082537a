"""A multi-node job is one dashboard row: rank 0's metrics, the job's state, every node listed."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.watch.jobrows import fold_jobs
from orchestrator.watch.model import RunView


def node(rank: int, state: str, *, exit_code=None, signal=None, step=None, ended="2026-12-01T00:00:0%dZ"):
    record = RunRecord(run_id=f"job1-n{rank}", job_id="job1", node_rank=rank, state=state,
                       ended_at=None if state == "running" else ended % rank, exit_code=exit_code, signal=signal)
    view = RunView(run_id=record.run_id, target=f"pve{rank + 1}/20{rank}", name="big", state=state,
                   exit_code=exit_code, signal=signal, last_step=step, created_at=f"2026-12-01T00:00:0{rank}Z",
                   ended_at=record.ended_at, exceptions=rank)
    return record, view


def test_a_job_folds_into_one_row_with_rank0_metrics() -> None:
    plain = (RunRecord(run_id="solo"), RunView(run_id="solo", target="local", name="solo", state="running"))
    rows, members = fold_jobs([node(1, "running", step=3), plain, node(0, "running", step=40)])
    job = next(r for r in rows if r.run_id == "job1")
    assert [r.run_id for r in rows] == ["solo", "job1"]  # by creation time; the solo run has none yet
    assert (job.state, job.last_step, job.target, job.exceptions) == ("running", 40, "pve1/200+pve2/201", 1)
    assert [n.node_rank for n in job.nodes] == [0, 1] and job.ended_at is None
    assert [v.run_id for v in members["job1"]] == ["job1-n0", "job1-n1"]


def test_a_failed_node_fails_the_job_and_names_its_signal() -> None:
    rows, _ = fold_jobs([node(0, "failed", exit_code=1), node(1, "failed", signal=9)])
    (job,) = rows
    assert job.state == "failed"
    assert (job.exit_code, job.signal) == (1, None)  # node 0 ended first (earlier ended_at)
    rows, _ = fold_jobs([node(0, "succeeded", exit_code=0), node(1, "failed", signal=9)])
    assert (rows[0].state, rows[0].signal) == ("failed", 9)
