"""Which ended multi-node jobs a headless watch relaunches as a whole (notify/relaunch.jobs_to_relaunch), from the
node records the agents send, through the watch's trackers: a job that lost a node or whose torchrun died with
worker restarts left, with relaunches left; never one a crash loop stopped, one whose workers failed through
every restart, one with a node killed, or one not every node of which was seen."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.notify.relaunch import _why_relaunched, jobs_to_relaunch
from orchestrator.watch.trackers import RunTracker


def node(rank: int, state: str, *, restarts: int = 2, attempts: int = 1, **extra) -> dict:
    return {"run_id": f"job1-n{rank}", "target": f"pve{rank + 1}/200", "name": "big", "state": state,
            "job_id": "job1", "node_rank": rank, "nnodes": 2, "worker_restarts": restarts,
            "attempts": [{"attempt": n + 1} for n in range(attempts)], **extra}


def chosen(*records: dict) -> list[str]:
    statuses = [RunTracker(r["target"], RunRecord.from_dict(r), history=1, tail=1).status() for r in records]
    return sorted(jobs_to_relaunch(statuses))


def test_a_job_whose_torchrun_died_with_restarts_left_is_relaunched() -> None:
    # node 1's torchrun was SIGKILLed (one attempt); node 0's restarted its workers once, then gave up on its peer
    assert chosen(node(0, "failed", attempts=2), node(1, "failed", attempts=1)) == ["job1"]
    assert chosen(node(0, "failed"), node(1, "lost")) == ["job1"]


def test_a_job_whose_workers_failed_through_every_restart_is_not() -> None:
    assert chosen(node(0, "failed", attempts=3), node(1, "failed", attempts=3)) == []


def test_a_crash_loop_a_kill_a_job_without_a_policy_or_relaunches_left_or_a_node_unseen_is_not() -> None:
    assert chosen(node(0, "failed", reason="crash loop"), node(1, "failed")) == []
    assert chosen(node(0, "killed"), node(1, "failed")) == []
    assert chosen(node(0, "failed", restarts=0), node(1, "lost", restarts=0)) == []
    assert chosen(node(0, "failed", job_relaunches=2), node(1, "lost", job_relaunches=2)) == []
    assert chosen(node(0, "failed", job_relaunches=1), node(1, "lost", job_relaunches=1)) == ["job1"]
    assert chosen(node(0, "running"), node(1, "lost")) == []
    assert chosen(node(1, "lost")) == []
    assert chosen(node(0, "failed", relaunched_as="job2-n0"), node(1, "lost")) == []


def test_the_relaunch_says_what_ended_the_job() -> None:
    def why(*records: dict) -> str:
        return _why_relaunched([RunTracker(r["target"], RunRecord.from_dict(r), history=1, tail=1).status() for r in records])

    assert why(node(0, "failed", attempts=3), node(1, "lost")) == "lost node 1 (pve2/200)"
    assert why(node(0, "failed", attempts=3), node(1, "failed")) == (
        "failed: the torchrun of node 1 (pve2/200) ended with worker restarts left")
