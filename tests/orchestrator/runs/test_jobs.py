"""A multi-node job from its node records (state, which node failed first), and what each node starts."""
from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from dflash_records.run import RunRecord
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.jobs import (JobSpec, failed_first, group_jobs, job_state, node_run_id, nproc_for,
                               torchrun_command)


def node(rank: int, state: str, ended_at: str | None = None, **extra) -> RunRecord:
    return RunRecord.from_dict({
        "run_id": f"job-1-n{rank}", "job_id": "job-1", "node_rank": rank, "nnodes": 2, "name": "job",
        "target": f"pve{rank + 1}/20{rank}", "state": state, "ended_at": ended_at,
        "created_at": f"2026-01-01T00:00:0{rank}Z", "exit_code": None, "signal": None, **extra})


@pytest.mark.parametrize("states, expected", [
    (["running", "running"], "running"), (["running", "failed"], "running"), (["failed", "killed"], "failed"),
    (["killed", "killed"], "killed"), (["succeeded", "succeeded"], "succeeded"), (["lost", "succeeded"], "failed"),
])
def test_job_state_from_node_states(states: list[str], expected: str) -> None:
    assert job_state([node(i, s) for i, s in enumerate(states)]) == expected


def test_the_node_that_ended_first_among_failed_ones_is_named_with_its_reason() -> None:
    nodes = [node(0, "failed", "2026-01-01T00:00:09.500Z", exit_code=1),
             node(1, "failed", "2026-01-01T00:00:09.100Z", signal=9, signal_name="SIGKILL")]
    first = failed_first(nodes)
    assert first.node_rank == 1 and first.target == "pve2/201"
    assert first.reason == "node 1 (pve2/201) failed: signal SIGKILL"
    assert failed_first([node(0, "killed", "x"), node(1, "succeeded", "y")]) is None


def test_group_jobs_folds_nodes_and_keeps_plain_runs() -> None:
    plain = RunRecord(run_id="solo", state="running")
    records = [node(1, "failed", "2026-01-01T00:00:05Z", exit_code=1), plain, node(0, "running")]
    runs, jobs = group_jobs(records)
    assert runs == [plain] and len(jobs) == 1
    job = jobs[0]
    assert job.job_id == "job-1" and [n.node_rank for n in job.nodes] == [0, 1]
    assert job.state == "running" and job.failed_first.node_rank == 1
    assert job.targets == ("pve1/200", "pve2/201") and job.ended_at is None
    shown = job.to_dict()  # ps --json's job: each node with its job's state and first failure
    assert shown["failed_first"]["node_rank"] == 1 and shown["targets"] == ["pve1/200", "pve2/201"]
    assert all(n["job_state"] == "running" and n["job_failed_first"] == 1 for n in shown["nodes"])


def test_a_relaunched_job_names_the_job_that_took_over_and_ps_says_so_under_its_table() -> None:
    from orchestrator.cli.ps import _rows

    nodes = [node(0, "failed", "2026-01-01T00:00:09Z", exit_code=1, relaunched_as="job-2-n0"),
             node(1, "failed", "2026-01-01T00:00:08Z", signal=9, signal_name="SIGKILL", relaunched_as="job-2-n1")]
    lost = RunRecord(run_id="solo", state="lost", relaunched_as="solo-2", created_at="2026-01-01T00:00:00Z")
    runs, jobs = group_jobs([lost, *nodes])
    assert jobs[0].relaunched_as == "job-2"
    assert group_jobs([node(0, "running"), node(1, "running")])[1][0].relaunched_as is None
    _, notes = _rows([lost, *nodes], jobs, datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc))
    assert notes == ["solo: lost; relaunched as solo-2",
                     "job-1: failed first: node 1 (pve2/201) failed: signal SIGKILL; relaunched as job-2"]


@pytest.fixture()
def inventory(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  pve1:\n    address: 10.0.0.1\n    containers:\n      200: {gpus: 8}\n"
                    "      201: {gpus: 0}\n")
    return load_inventory(path)


def test_processes_per_node(inventory) -> None:
    eight, none = inventory.target("pve1/200"), inventory.target("pve1/201")
    spec = JobSpec(targets=[eight, none], config_text=b"", name="j")
    assert (nproc_for(eight, spec), nproc_for(none, spec)) == (8, 1)
    assert nproc_for(eight, JobSpec(targets=[], config_text=b"", name="j", gpus=[0, 1])) == 2
    assert nproc_for(eight, JobSpec(targets=[], config_text=b"", name="j", cpu_only=True)) == 1
    assert nproc_for(none, JobSpec(targets=[], config_text=b"", name="j", nproc_per_node=3)) == 3


def test_torchrun_command_of_a_node(inventory) -> None:
    target = inventory.target("pve1/200")
    argv = torchrun_command(target, agent_path="/w/agent.pyz", nnodes=2, nproc=8, endpoint="10.0.0.1:29500",
                            job_id="job-1", is_host=True, local_addr="10.0.0.1", timeout=120,
                            base_dir="/workspace")
    assert argv[:5] == [target.python, "/w/agent.pyz", "node-watch", "--stall=120", "--"]
    torchrun = argv[5:]
    assert torchrun[:3] == [target.python, "-m", "torch.distributed.run"]
    for flag in ("--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
                 "--rdzv-id=job-1", "--local-addr=10.0.0.1", "--max-restarts=0",
                 "--rdzv-conf=is_host=true,join_timeout=120,read_timeout=60"):
        assert flag in torchrun
    assert torchrun[-7:] == ["-m", "trainer", "train", "--config", "config.yaml", "--base-dir", "/workspace"]
    assert node_run_id("job-1", 1) == "job-1-n1"


def test_a_launched_config_s_relative_paths_are_taken_from_where_its_files_are(inventory, tmp_path) -> None:
    # a run works in its own run directory, where no data is: on `local` the config file's directory places the
    # paths (whatever directory dflashctl runs in), on a container its workdir (the file's directory here means
    # nothing there)
    from orchestrator.runs.command import config_base_dir, train_command

    container, local = inventory.target("pve1/200"), inventory.target("local")
    config = tmp_path / "project" / "small.yaml"
    assert config_base_dir(local, str(config)) == str(tmp_path / "project")
    assert config_base_dir(container, str(config)) == container.workdir == "/workspace"
    assert train_command(container, nproc=1, base_dir="/workspace")[-2:] == ["--base-dir", "/workspace"]
