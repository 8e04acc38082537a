"""One training job across two lab hosts: the real trainer under torchrun (c10d rendezvous, gloo on the CPU,
the tiny target), by hand and through `dflashctl launch pve1/200 pve2/300`; how such a job ends when it is
killed, when one node's workload is SIGKILLed and when one host's link is cut; and how a job with a restart
policy heals: torchrun restarting its workers, a headless watch relaunching a job lost with a container or
whose torchrun died."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import OperationFailed
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RunClient
from orchestrator.runs.jobs import relaunch_job
from orchestrator.transports.pool import Connections
from tests.lab.workloads import run_cli as cli
from tests.on_lab import lab_configs
from tests.on_lab.lab_configs import write_config
from tests.polling import wait_for
from tests.trainer.conftest import REPO_ROOT, write_prompts

pytestmark = pytest.mark.lab
NODES = (("pve1", 200), ("pve2", 300))
TARGETS = ("pve1/200", "pve2/300")
DIGEST = re.compile(r"rank (\d+) drafter weights digest ([0-9a-f]{16})")
DIST_TIMEOUT_S = 15  # the failure tests' --dist-timeout: how soon a job ends once a node died or was cut
# Jobs that must train get more: it also bounds how far apart the nodes' torchruns and workers arrive after
# importing torch (15 to 86 s each on a loaded 2-core host): a node 15 s behind fails the job (as in a CI run).
JOINING_S = 120


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The tiny target, and a dataset of its own answers, where every lab container can read them."""
    from trainer.data.generate import generate
    from trainer.data.prepare import prepare
    from trainer.model.tiny_target import write_tiny_target

    root = tmp_path_factory.mktemp("multinode-data")
    target = write_tiny_target(root / "target", seed=0)
    prompts = write_prompts(root / "prompts.jsonl", 48, seed=1)
    generate(target=target, prompts=prompts, output=root / "chats.jsonl", max_new_tokens=64, batch_size=48,
             device="cpu")
    prepare(target=target, input_path=root / "chats.jsonl", output=root / "dataset", block_size=8)
    return {"target": target, "dataset": root / "dataset"}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    return str(lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml"))


def checkpoint_digest(tiny: dict[str, Path], checkpoint: Path) -> str:
    """The digest the trainer prints, computed from a checkpoint (the drafter shares the target's frozen
    embedding and LM head)."""
    from transformers import AutoModelForCausalLM

    from trainer.model.drafter_files import load_drafter
    from trainer.training.distributed import weights_digest

    model = AutoModelForCausalLM.from_pretrained(str(tiny["target"])).requires_grad_(False)
    drafter = load_drafter(checkpoint, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings())
    return weights_digest(drafter)


def job_of(inv: str, capsys, job_id: str, *targets: str) -> dict | None:
    code, payload, err = cli(inv, "ps", *targets, "--all", "--json", capsys=capsys)
    assert isinstance(payload, dict), err
    return next((job for job in payload["jobs"] if job["job_id"] == job_id), None)


def wait_job(inv: str, capsys, job_id: str, done, *targets: str, timeout: float = 90) -> dict:
    """The job's record once `done(job)`, else its last one after `timeout` seconds."""
    seen: list[dict | None] = []

    def reached() -> bool:
        seen.append(job_of(inv, capsys, job_id, *targets))
        return bool(seen[-1] and done(seen[-1]))

    wait_for(reached, timeout, 0.5)
    return seen[-1]


def told(inv: str, capsys, job: dict | None, job_id: str) -> str:
    """What an assertion on a job's end says: its nodes' records and each node's log tail."""
    tails = [cli(inv, "logs", job_id, "--node", str(rank), "-n", "40", capsys=capsys) for rank in (0, 1)]
    return "\n".join([json.dumps(job and job["nodes"], indent=1), *(
        f"--- node {rank}'s log (exit {code}):\n{out}{err}" for rank, (code, out, err) in enumerate(tails))])


def all_ended(job: dict) -> bool:
    return all(node["state"] not in ("starting", "running") for node in job["nodes"])


def processes_of(lab, run_ids: set[str], nodes=NODES) -> list:
    return [p for host, ctid in nodes for p in lab.ct_processes(host, ctid)
            if p.environ.get("DFLASH_RUN_ID") in run_ids and p.state != "Z"]


def launch_job(inv: str, capsys, config: Path, *extra: str, dist_timeout: float = DIST_TIMEOUT_S) -> dict:
    code, job, err = cli(inv, "launch", *TARGETS, "--config", str(config), "--dist-timeout",
                         str(dist_timeout), "--json", *extra, capsys=capsys)
    assert code == 0, err
    return job


def wait_training(inv: str, capsys, job_id: str, timeout: float = 90) -> None:
    """Until node 0's log shows steps: every rank has joined the group and trains."""
    def training() -> bool:
        code, out, _ = cli(inv, "logs", job_id, "-n", "5", capsys=capsys)
        return code == 0 and "step=" in str(out)

    wait_for(training, timeout, 0.5, what=f"job {job_id} training")


def wait_past_a_checkpoint(inv: str, capsys, job_id: str) -> None:
    """Until node 0's log shows step 5 or later: past the first checkpoint of a config saving every 3 steps."""
    def past() -> bool:
        code, out, _ = cli(inv, "logs", job_id, "-n", "400", capsys=capsys)
        return code == 0 and re.search(r"\] step=([5-9]|\d\d) ", str(out)) is not None
    wait_for(past, 120, 0.5, what=f"job {job_id} training past its first checkpoint")


def relaunches_said(inv: str, tmp_path: Path, *, timeout: float, meanwhile=lambda: None) -> list[dict]:
    """The relaunch lines of a `watch --headless` on both targets: started, `meanwhile()` called, then the lines
    waited for up to `timeout` seconds; the watcher is then stopped and must have ended cleanly."""
    out = tmp_path / "headless.jsonl"
    with out.open("w") as stdout:
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inv, "watch", *TARGETS,
                                    "--headless", "--no-notify"], stdout=stdout, stderr=subprocess.PIPE,
                                   env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, text=True)
        try:
            meanwhile()
            said = wait_for(lambda: [line for line in map(json.loads, out.read_text().splitlines())
                                     if line.get("type", "").startswith("relaunch")], timeout, 0.3,
                            what=lambda: out.read_text())
        finally:
            watcher.send_signal(signal.SIGTERM)
            _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0 and "Traceback" not in err, err
    return said


# ---- by hand ---------------------------------------------------------------------------------------------

def test_torchrun_by_hand_across_two_hosts_keeps_four_ranks_identical(lab, tiny, tmp_path) -> None:
    config = write_config(tmp_path / "job.yaml", tiny, output_dir="/workspace/by-hand-out")
    endpoint = f"{lab.hosts['pve1'].address}:{29400 + os.getpid() % 500}"
    procs = []
    for rank, (host, ctid) in enumerate(NODES):
        link = lab.hosts[host].link
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id=by-hand-{os.getpid()}",
                f"--rdzv-conf=is_host={str(rank == 0).lower()},join_timeout=60", f"--local-addr={link.address}",
                "--max-restarts=0", "-m", "trainer", "train", "--config", str(config)]
        env = {"PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": link.host_veth, "DFLASH_DIST_TIMEOUT_S": "30",
               "DFLASH_RANK_OFFSET": str(2 * rank), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        procs.append(lab.ct_start(host, ctid, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True))
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=150)[0])
        finally:
            proc.kill()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:]
    digests = [dict(DIGEST.findall(out)) for out in outputs]
    assert sorted(digests[0]) == ["0", "1"] and sorted(digests[1]) == ["2", "3"]  # node order as given
    assert len({*digests[0].values(), *digests[1].values()}) == 1
    out_pve1 = lab.hosts["pve1"].containers[200].workspace / "by-hand-out"
    assert (out_pve1 / "step_6").is_dir(), "rank 0 writes the checkpoints on the first node"
    assert not (lab.hosts["pve2"].containers[300].workspace / "by-hand-out" / "step_6").exists()
    assert checkpoint_digest(tiny, out_pve1 / "step_6") == digests[0]["0"]


# ---- through dflashctl -----------------------------------------------------------------------------------

def test_launch_on_two_targets_trains_one_job(lab, tiny, inv, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "two-node.yaml", tiny)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "2", dist_timeout=JOINING_S)
    job_id = job["job_id"]
    nodes = job["nodes"]
    assert [n["target"] for n in nodes] == list(TARGETS) and [n["node_rank"] for n in nodes] == [0, 1]
    assert all(n["job_id"] == job_id and n["nnodes"] == 2 and n["run_id"] == f"{job_id}-n{n['node_rank']}"
               for n in nodes)
    assert job["rendezvous"].startswith(lab.hosts["pve1"].address + ":")
    done = wait_job(inv, capsys, job_id, all_ended)
    assert done and done["state"] == "succeeded", told(inv, capsys, done, job_id)
    assert [n["state"] for n in done["nodes"]] == ["succeeded", "succeeded"]
    run_json = json.loads(lab.ct_run("pve2", 300, ["cat", f"{nodes[1]['run_dir']}/run.json"]).stdout)
    assert (run_json["job_id"], run_json["node_rank"], run_json["nnodes"]) == (job_id, 1, 2)

    code, node0_log, _ = cli(inv, "logs", job_id, "-n", "400", capsys=capsys)
    assert code == 0 and "World: 4 process(es)" in node0_log and "step=6" in node0_log
    code, node1_log, _ = cli(inv, "logs", job_id, "--node", "1", "-n", "400", capsys=capsys)
    assert code == 0 and "step=" not in node1_log  # rank 0's step lines are the job's, and they are on node 0
    digests = {**dict(DIGEST.findall(node0_log)), **dict(DIGEST.findall(node1_log))}
    assert sorted(digests) == ["0", "1", "2", "3"] and len(set(digests.values())) == 1, digests
    out = lab_configs.output_dir(config)  # relative: under each node's workdir
    checkpoint = lab.hosts["pve1"].containers[200].workspace / out / "step_6"
    assert checkpoint_digest(tiny, checkpoint) == digests["0"]
    assert not (lab.hosts["pve2"].containers[300].workspace / out / "step_6").exists(), \
        "checkpoints are written once, on node 0"

    code, table, _ = cli(inv, "ps", "--all", capsys=capsys)
    assert table.count(job_id) == 3 and "2 nodes" in table  # the job's row, then one row per node

    code, snapshot, _ = cli(inv, "watch", *TARGETS, "--once", "--json", "--timeout", "30", capsys=capsys)
    rows = [r for r in snapshot["runs"] if r["run_id"].startswith(job_id)]
    assert [r["run_id"] for r in rows] == [job_id]  # the dashboard shows the job once...
    assert [(n["node_rank"], n["target"]) for n in rows[0]["nodes"]] == [(0, TARGETS[0]), (1, TARGETS[1])]
    assert (rows[0]["state"], rows[0]["last_step"]) == ("succeeded", 6)  # ...with rank 0's steps


def test_a_job_resumes_as_a_whole_from_node0s_checkpoint(lab, tiny, inv, tmp_path, capsys) -> None:
    """Only node 0 holds checkpoints; a relaunch resumes every rank from rank 0's, not rank 0 alone."""
    out = f"/workspace/resume-{os.getpid()}"
    first = launch_job(inv, capsys, write_config(tmp_path / "a.yaml", tiny, output_dir=out, max_steps=6),
                       "--nproc-per-node", "1", dist_timeout=JOINING_S)
    ended = wait_job(inv, capsys, first["job_id"], all_ended)
    assert ended and ended["state"] == "succeeded", told(inv, capsys, ended, first["job_id"])
    node1_out = lab.hosts["pve2"].containers[300].workspace / out.removeprefix("/workspace/")
    assert not list(node1_out.glob("step_*"))  # the other node has no checkpoint to resume from
    second = launch_job(inv, capsys, write_config(tmp_path / "b.yaml", tiny, output_dir=out, max_steps=9),
                        "--nproc-per-node", "1", dist_timeout=JOINING_S)
    ended = wait_job(inv, capsys, second["job_id"], all_ended)
    assert ended and ended["state"] == "succeeded", told(inv, capsys, ended, second["job_id"])
    code, node0_log, _ = cli(inv, "logs", second["job_id"], "-n", "400", capsys=capsys)
    code1, node1_log, _ = cli(inv, "logs", second["job_id"], "--node", "1", "-n", "400", capsys=capsys)
    assert code == code1 == 0
    assert f"Resumed from {out}/step_6 at step 6" in node0_log
    steps = [int(s) for s in re.findall(r"\] step=(\d+) ", node0_log)]
    assert steps and min(steps) == 7 and max(steps) == 9  # trained on from 6, not again from 1
    digests = {**dict(DIGEST.findall(node0_log)), **dict(DIGEST.findall(node1_log))}
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, digests


def test_kill_job_stops_every_node_and_leaves_nothing(lab, tiny, inv, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "long.yaml", tiny, max_steps=100000, checkpoint_every=0, log_every=5)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1", dist_timeout=JOINING_S)
    run_ids = {n["run_id"] for n in job["nodes"]}
    wait_training(inv, capsys, job["job_id"])
    assert {p.environ["DFLASH_RUN_ID"] for p in processes_of(lab, run_ids)} == run_ids
    code, result, err = cli(inv, "kill", job["job_id"], "--grace", "2", "--json", capsys=capsys)
    assert code == 0, err
    assert set(result["targets"]) == set(TARGETS) and all(t["ok"] for t in result["targets"].values())
    assert processes_of(lab, run_ids) == []
    ended = job_of(inv, capsys, job["job_id"])
    assert ended["state"] == "killed" and {n["state"] for n in ended["nodes"]} == {"killed"}


# ---- failures ----------------------------------------------------------------------------------------------

def test_sigkill_of_one_node_fails_the_job_on_every_node(lab, tiny, inv, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "long.yaml", tiny, max_steps=100000, checkpoint_every=0, log_every=5)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1")
    run_ids = {n["run_id"] for n in job["nodes"]}
    wait_training(inv, capsys, job["job_id"])
    node1 = job["nodes"][1]
    torchrun = next(p for p in lab.ct_processes("pve2", 300) if p.pid == node1["pid"])
    os.kill(torchrun.host_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    ended = wait_job(inv, capsys, job["job_id"], all_ended, timeout=DIST_TIMEOUT_S + 30)
    assert time.monotonic() - killed_at < DIST_TIMEOUT_S + 30
    assert ended["state"] == "failed" and [n["state"] for n in ended["nodes"]] == ["failed", "failed"], ended
    first = ended["failed_first"]
    assert first["node_rank"] == 1 and first["target"] == "pve2/300" and first["signal"] == signal.SIGKILL
    assert all(n["job_failed_first"] == 1 for n in ended["nodes"])
    assert processes_of(lab, run_ids) == []
    code, table, _ = cli(inv, "ps", "--all", capsys=capsys)
    assert "failed first: node 1 (pve2/300)" in table


def test_cutting_one_hosts_link_fails_the_job_instead_of_hanging(lab, tiny, inv, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "long.yaml", tiny, max_steps=100000, checkpoint_every=0, log_every=5)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1")
    run_ids = {n["run_id"] for n in job["nodes"]}
    wait_training(inv, capsys, job["job_id"])
    lab.link_down("pve2")
    try:
        cut_at = time.monotonic()
        survivor = wait_job(inv, capsys, job["job_id"], all_ended, "pve1/200", timeout=DIST_TIMEOUT_S + 60)
        assert survivor["nodes"][0]["state"] == "failed", survivor
        assert time.monotonic() - cut_at < DIST_TIMEOUT_S + 60
        assert processes_of(lab, run_ids, nodes=[NODES[0]]) == []
        # the cut-off node gives up too: no process of it waits for a peer that will never answer
        deadline = time.monotonic() + DIST_TIMEOUT_S + 60
        while processes_of(lab, run_ids, nodes=[NODES[1]]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_of(lab, run_ids, nodes=[NODES[1]]) == []
    finally:
        lab.link_up("pve2")
    ended = wait_job(inv, capsys, job["job_id"], all_ended)
    assert ended["state"] == "failed" and [n["state"] for n in ended["nodes"]] == ["failed", "failed"]


# ---- a job restarts as a whole ------------------------------------------------------------------------------

def test_a_job_with_a_restart_policy_restarts_every_node_together_and_resumes(lab, tiny, inv, tmp_path,
                                                                              capsys) -> None:
    """A worker SIGKILLed on node 1: torchrun restarts the workers of both nodes together through the rendezvous
    (no controller; neither supervisor restarts its node alone), they resume from node 0's newest checkpoint, and
    the job ends succeeded."""
    config = write_config(tmp_path / "restart.yaml", tiny, max_steps=40, checkpoint_every=3, log_every=1)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1", "--restart", "on-failure:1",
                     "--restart-backoff", "1.5")
    nodes = job["nodes"]
    assert [n["restart_policy"] for n in nodes] == ["never", "never"]  # no node restarts alone
    assert [n["worker_restarts"] for n in nodes] == [1, 1]

    wait_past_a_checkpoint(inv, capsys, job["job_id"])
    workers = [p for p in lab.ct_processes("pve2", 300) if p.environ.get("DFLASH_RUN_ID") == nodes[1]["run_id"]
               and "trainer" in p.cmdline and "torch.distributed.run" not in p.cmdline and p.state != "Z"]
    assert len(workers) == 1, workers
    os.kill(workers[0].host_pid, signal.SIGKILL)
    ended = wait_job(inv, capsys, job["job_id"], all_ended, timeout=240)
    assert ended["state"] == "succeeded" and [n["state"] for n in ended["nodes"]] == ["succeeded"] * 2, ended
    # torchrun restarted the workers, the supervisors nothing: each node counts the restart it saw as an attempt
    # (one whose torchrun restarted for the other node's arrival counts none: torchrun numbers only its failures)
    assert [n["max_attempts"] for n in ended["nodes"]] == [2, 2]
    assert max(n["attempt"] for n in ended["nodes"]) == 2, ended
    assert "workers restarted" in [a["reason"] for n in ended["nodes"] for a in n["attempts"]]
    code, node0_log, _ = cli(inv, "logs", job["job_id"], "-n", "2000", capsys=capsys)
    assert code == 0 and re.search(r"Resumed from \S+/step_\d+ at step \d+", node0_log), node0_log[-3000:]
    assert "step=40 " in node0_log
    # torchrun restarts at once; the workers of the node whose worker died waited the policy's backoff first
    code, node1_log, _ = cli(inv, "logs", nodes[1]["run_id"], "-n", "2000", capsys=capsys)
    assert code == 0 and "restart 1 of the job's workers: waiting 1.5 s before they start again" in node1_log


def test_a_job_lost_with_a_container_is_relaunched_as_a_whole_by_a_headless_watch(lab, tiny, inv, tmp_path,
                                                                                  capsys) -> None:
    """Node 1's container reboots mid-run: its node is lost and node 0 fails once its peer is gone. A headless
    watch starts the job again on every node under a new job id, once; it resumes from node 0's checkpoint and
    succeeds, and a second relaunch of the same loss is refused."""
    config = write_config(tmp_path / "lost.yaml", tiny, max_steps=40, checkpoint_every=3, log_every=1)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1", "--restart", "on-failure:1")

    wait_past_a_checkpoint(inv, capsys, job["job_id"])
    lab.pct("pve2", "reboot", "300", check=True)
    ended = wait_job(inv, capsys, job["job_id"], all_ended, timeout=120)
    assert [n["state"] for n in ended["nodes"]] == ["failed", "lost"], ended

    [line] = relaunches_said(inv, tmp_path, timeout=90)
    assert line["type"] == "relaunched" and line["job_id"] == job["job_id"], line
    assert "node 1 (pve2/300)" in line["message"], line
    new_job = line["new_job_id"]

    again = wait_job(inv, capsys, new_job, all_ended, timeout=240)
    assert again["state"] == "succeeded" and [n["state"] for n in again["nodes"]] == ["succeeded"] * 2, again
    old = job_of(inv, capsys, job["job_id"])
    assert [n["relaunched_as"] for n in old["nodes"]] == [f"{new_job}-n0", f"{new_job}-n1"], old
    code, node0_log, _ = cli(inv, "logs", new_job, "-n", "2000", capsys=capsys)
    assert code == 0 and re.search(r"Resumed from \S+/step_\d+ at step \d+", node0_log), node0_log[-3000:]
    assert "step=40 " in node0_log
    with Connections() as conns:  # a second watcher's relaunch of the same loss starts nothing
        client = RunClient(load_inventory(Path(inv)), conns)
        nodes = [(client.inventory.target(n["target"]), n["run_id"], n["node_rank"]) for n in old["nodes"]]
        with pytest.raises(OperationFailed, match="already relaunched as " + new_job):
            relaunch_job(client, nodes, "again")


def test_a_job_whose_torchrun_died_is_relaunched_as_a_whole_by_a_headless_watch(lab, tiny, inv, tmp_path,
                                                                                  capsys) -> None:
    """Node 1's torchrun is SIGKILLed (as the OOM killer would): its workers go with it, node 0 gives up on its
    peer, and torchrun's own restarts cannot heal that. A headless watch, already running, relaunches the job on
    every node, which spends one of its restarts; it resumes from node 0's checkpoint and succeeds."""
    config = write_config(tmp_path / "died.yaml", tiny, max_steps=40, checkpoint_every=3, log_every=1)
    job = launch_job(inv, capsys, config, "--nproc-per-node", "1", "--restart", "on-failure:1",
                     "--restart-backoff", "0.5")

    def kill_node1s_torchrun() -> None:
        wait_past_a_checkpoint(inv, capsys, job["job_id"])
        torchrun = next(p for p in lab.ct_processes("pve2", 300) if p.pid == job["nodes"][1]["pid"])
        os.kill(torchrun.host_pid, signal.SIGKILL)
    [line] = relaunches_said(inv, tmp_path, timeout=DIST_TIMEOUT_S + 120, meanwhile=kill_node1s_torchrun)
    assert line["type"] == "relaunched" and line["job_id"] == job["job_id"], line
    assert "node 1 (pve2/300)" in line["message"] and "ended with worker restarts left" in line["message"], line
    old = job_of(inv, capsys, job["job_id"])
    assert [n["state"] for n in old["nodes"]] == ["failed", "failed"], old
    assert old["nodes"][1]["signal"] == signal.SIGKILL and old["relaunched_as"] == line["new_job_id"], old

    again = wait_job(inv, capsys, line["new_job_id"], all_ended, timeout=240)
    assert again["state"] == "succeeded" and [n["state"] for n in again["nodes"]] == ["succeeded"] * 2, again
    assert [n["job_relaunches"] for n in again["nodes"]] == [1, 1]  # the relaunch spent the job's one restart
    code, node0_log, _ = cli(inv, "logs", line["new_job_id"], "-n", "2000", capsys=capsys)
    assert code == 0 and re.search(r"Resumed from \S+/step_\d+ at step \d+", node0_log), node0_log[-3000:]


def test_a_sweep_of_four_tiny_runs_is_ranked_by_tau_in_its_report(lab, tiny, inv, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "sweep.yaml", tiny, max_steps=1, checkpoint_every=0, eval_every=1,
                          eval_samples=2, eval_tree_budgets=[4], heldout_path=str(tiny["dataset"]))
    code, started, err = cli(inv, "sweep", str(config), "--set", "lr=1e-4,3e-2", "--set", "seed=0,1", "--gpus",
                             "none", "--name", "tiny", "--json", *TARGETS, capsys=capsys)
    assert code == 0, err
    sweep_id = started["sweep_id"]
    assert sweep_id.startswith("sweep-tiny-") and [r["target"] for r in started["runs"]] == [*TARGETS, *TARGETS]
    assert [r["sweep_values"] for r in started["runs"]] == [{"lr": 1e-4, "seed": 0}, {"lr": 1e-4, "seed": 1},
                                                            {"lr": 3e-2, "seed": 0}, {"lr": 3e-2, "seed": 1}]

    def ended() -> list[dict] | None:
        code, listed, _ = cli(inv, "ps", "--sweep", sweep_id, "--json", capsys=capsys)
        runs = listed["runs"] if code == 0 else []
        return runs if len(runs) == 4 and all(r["state"] in ("succeeded", "failed", "lost") for r in runs) else None

    runs = wait_for(ended, 120, 1.0, what="the sweep's four runs to end")  # each look is a ps: let them train
    assert {r["state"] for r in runs} == {"succeeded"} and {r["sweep_id"] for r in runs} == {sweep_id}
    out = lab.hosts["pve2"].containers[300].workspace / lab_configs.output_dir(config)
    assert (out / f"{started['runs'][1]['name']}" / "metrics.jsonl").is_file()  # each run writes its own directory

    code, report, err = cli(inv, "sweep", "report", sweep_id, "--json", capsys=capsys)
    assert code == 0, err
    taus = [r["tau_heldout"] for r in report["runs"]]
    assert report["keys"] == ["lr", "seed"] and len(taus) == 4 and all(tau >= 1.0 for tau in taus), report
    assert taus == sorted(taus, reverse=True) and all(r["last_step"] == 1 for r in report["runs"])
    assert all(set(r["tau_tree_heldout"]) == {"4"} for r in report["runs"])
    code, table, _ = cli(inv, "sweep", "report", sweep_id, "--markdown", capsys=capsys)
    assert code == 0 and table.splitlines()[2].startswith(f"| 1 | {report['runs'][0]['run_id']} |")
