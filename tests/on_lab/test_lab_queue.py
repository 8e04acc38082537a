"""The container's GPU queue on the lab: the real agent over SSH + pct exec, three containers of two GPUs each, the
fake nvidia-smi; queued runs start with no controller running, survive a reboot, and keep a foreign GPU out."""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RunClient
from orchestrator.runs.deploy import agent_path_in
from orchestrator.runs.spec import runs_dir
from orchestrator.transports.pool import Connections
from tests.lab.workloads import GATED, run_cli
from tests.polling import wait_for

pytestmark = pytest.mark.lab
BOXES = (("pve1", 210), ("pve1", 211), ("pve2", 310))


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    with lab.more_containers(BOXES, tmp_path_factory.mktemp("inv") / "inventory.yaml", gpus=2) as inventory:
        yield str(inventory)


def run_dir(lab, box: tuple, run_id: str) -> Path:
    return lab.hosts[box[0]].containers[box[1]].workspace / ".dflash" / "runs" / run_id


def state(lab, box: tuple, run_id: str) -> dict:
    try:
        return json.loads((run_dir(lab, box, run_id) / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def queue_args(target, run_id: str, shell: str, *extra: str) -> list:
    return ["launch", "--runs-dir", runs_dir(target), "--run-id", run_id, "--name", "queued", "--target",
            target.name, "--settle", "0.3", "--queue", "--gpu-count", "1", *extra, "--", "sh", "-c", shell]


def agent(inv: str, box: tuple, args_of) -> dict:
    with Connections() as conns:
        client = RunClient(load_inventory(Path(inv)), conns)
        target = client.inventory.target("{}/{}".format(*box))
        return client.agent(target, args_of(target))


# the controller: twelve launches into the queues of three containers, one line each, then it watches (ps) until
# it is SIGKILLed
CONTROLLER = """
import json, sys, time
from pathlib import Path
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import runs_dir
from orchestrator.transports.pool import Connections
from tests.lab.workloads import GATED
from tests.on_lab.test_lab_queue import BOXES, queue_args
with Connections() as conns:
    client = RunClient(load_inventory(Path(sys.argv[1])), conns)
    targets = [client.inventory.target("{}/{}".format(*box)) for box in BOXES]
    for i in range(12):
        target = targets[i % 3]
        answer = client.agent(target, queue_args(target, "{}-{}".format(sys.argv[2], i), GATED))
        print(json.dumps(answer["run"]), flush=True)
    while True:
        for target in targets:
            client.agent(target, ["ps", "--runs-dir", runs_dir(target)])
        time.sleep(0.2)
"""


def test_twelve_runs_on_three_boxes_run_through_their_queues_with_the_controller_killed(lab, inv, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, inv, "q12"], stdout=subprocess.PIPE, env=env)
    try:
        runs = [json.loads(controller.stdout.readline()) for _ in range(12)]
    finally:
        controller.send_signal(signal.SIGKILL)  # in the middle: twelve runs in, six of them waiting
        controller.wait(timeout=10)
    boxes = {run["run_id"]: BOXES[i % 3] for i, run in enumerate(runs)}
    assert [r["state"] for r in runs] == ["running"] * 6 + ["queued"] * 6, runs
    assert [r["queue_position"] for r in runs[6:]] == [1, 1, 1, 2, 2, 2]
    gaps = []
    for first, waiting in zip(runs[:6], runs[6:]):  # nothing of the controller runs from here on
        box = boxes[first["run_id"]]
        assert state(lab, box, waiting["run_id"])["state"] == "queued"
        lab.open_gate(*box, first["run_id"])
        assert wait_for(lambda: state(lab, box, waiting["run_id"]).get("state") == "running", 20), \
            state(lab, box, waiting["run_id"])
        log = run_dir(lab, box, waiting["run_id"]) / "train.log"
        assert wait_for(lambda: log.exists() and log.stat().st_size > 0, 10)
        ended = (run_dir(lab, box, first["run_id"]) / "state.json").stat().st_mtime
        gaps.append(log.stat().st_mtime - ended)
        assert state(lab, box, first["run_id"])["state"] == "succeeded" and gaps[-1] > 0
        taken = json.loads((run_dir(lab, box, waiting["run_id"]) / "run.json").read_text())["gpus"]
        assert taken == first["gpus"]  # the GPU that end freed
    for run in runs[6:]:
        lab.open_gate(*boxes[run["run_id"]], run["run_id"])
    assert wait_for(lambda: all(state(lab, boxes[r["run_id"]], r["run_id"]).get("state") == "succeeded"
                                for r in runs), 20)
    print("end -> next queued run's first line: median {:.2f} s, max {:.2f} s".format(statistics.median(gaps),
                                                                                    max(gaps)))
    assert max(gaps) < 10  # the figure is the goal (<= 2 s on a quiet machine); the bound leaves room for load


def test_a_reboot_with_three_queued_runs_starts_them_after_it(lab, inv):
    box = BOXES[1]
    holders = [agent(inv, box, lambda t, i=i: queue_args(t, "rb-hold-{}".format(i), GATED)) for i in range(2)]
    assert [h["run"]["state"] for h in holders] == ["running", "running"]
    waiting = [agent(inv, box, lambda t, i=i: queue_args(t, "rb-wait-{}".format(i), "echo up; sleep 0.5"))
               for i in range(3)]
    assert [w["run"]["queue_position"] for w in waiting] == [1, 2, 3]
    lab.pct(box[0], "reboot", str(box[1]), check=True)
    assert [state(lab, box, w["run"]["run_id"])["state"] for w in waiting] == ["queued"] * 3
    # no keeper runs after the reboot; the next contact (here the queue's listing) starts one, and it resumes
    answer = agent(inv, box, lambda t: ["queue", "--runs-dir", runs_dir(t)])
    assert answer["ok"] and answer["gpus_total"] == 2
    assert wait_for(lambda: all(state(lab, box, w["run"]["run_id"]).get("state") == "succeeded" for w in waiting),
                    30), [state(lab, box, w["run"]["run_id"]) for w in waiting]
    listed = {r["run_id"]: r for r in agent(inv, box, lambda t: ["ps", "--runs-dir", runs_dir(t)])["runs"]}
    assert [listed[h["run"]["run_id"]]["state"] for h in holders] == ["lost", "lost"]


def test_a_foreign_gpu_holder_and_kill_of_a_queued_run(lab, inv, capsys):
    box = BOXES[2]
    lab.set_gpus(*box, [{"memory.used": 0}, {"memory.used": 30000}])  # GPU 1: memory no run of ours holds
    try:
        first = agent(inv, box, lambda t: queue_args(t, "fg-first", GATED))["run"]
        second = agent(inv, box, lambda t: queue_args(t, "fg-second", "echo up"))["run"]
        doomed = agent(inv, box, lambda t: queue_args(t, "fg-doomed", "echo never"))["run"]
        assert (first["gpus"], second["state"], doomed["queue_position"]) == ([0], "queued", 2)
        answer = agent(inv, box, lambda t: ["queue", "--runs-dir", runs_dir(t)])
        assert (answer["gpus_foreign"], answer["gpus_ours"], answer["gpus_free"]) == ([1], [0], [])
        code, killed, err = run_cli(inv, "kill", "fg-doomed", "--json", capsys=capsys)
        assert code == 0, err
        lab.open_gate(*box, "fg-first")
        assert wait_for(lambda: state(lab, box, "fg-second").get("state") == "succeeded", 20)
        assert json.loads((run_dir(lab, box, "fg-second") / "run.json").read_text())["gpus"] == [0]
        assert state(lab, box, "fg-doomed")["state"] == "killed"
        assert not (run_dir(lab, box, "fg-doomed") / "train.log").exists()
    finally:
        lab.set_gpus(*box, [{}, {}])


def test_twenty_concurrent_enqueues_into_one_container_get_one_order(lab, inv):
    box = BOXES[0]
    holder = agent(inv, box, lambda t: queue_args(t, "cc-hold", GATED, "--gpu-count", "2"))["run"]
    assert holder["state"] == "running"
    inventory = load_inventory(Path(inv))
    target = inventory.target("{}/{}".format(*box))
    argv = ["python3", agent_path_in(target.workdir)]
    procs = [lab.ct_start(*box, argv + queue_args(target, "cc-{}".format(i), "echo up"), stdout=subprocess.PIPE)
             for i in range(20)]
    answers = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(a["ok"] and a["run"]["state"] == "queued" for a in answers), answers
    places = sorted(a["run"]["queue_position"] for a in answers)
    assert places == list(range(1, 21))
    listed = agent(inv, box, lambda t: ["queue", "--runs-dir", runs_dir(t)])["queued"]
    assert sorted(q["run_id"] for q in listed) == sorted("cc-{}".format(i) for i in range(20))
    assert [q["position"] for q in listed] == list(range(1, 21))
    killed = agent(inv, box, lambda t: ["kill", "--runs-dir", runs_dir(t), "--run-id",
                                        *["cc-{}".format(i) for i in range(20)]])
    assert killed["ok"] and {r["state"] for r in killed["runs"]} == {"killed"}
    lab.open_gate(*box, "cc-hold")


def test_the_queue_through_the_cli_ps_watch_kill_and_a_failed_start(lab, inv, capsys):
    """dflashctl end to end: launch --queue/--gpu-count, ps (`queued (2nd)` and what it waits for), ps --queue,
    watch --once --json (the place, from the agent's watch stream), kill of a queued run (nothing starts), and a
    queued run whose start fails: `failed` with the reason, and the run behind it starts."""
    box = BOXES[2]
    name = "{}/{}".format(*box)

    def launch(run_name: str, shell: str, *gpus: str) -> dict:
        code, out, err = run_cli(inv, "launch", name, "--name", run_name, *gpus, "--json", "--", "sh", "-c", shell,
                                 capsys=capsys)
        assert code == 0 and isinstance(out, dict), err
        return out

    holder = launch("cli-hold", GATED, "--gpu-count", "2")
    assert holder["state"] == "running" and sorted(holder["gpus"]) == [0, 1]
    first = launch("cli-first", GATED, "--gpu-count", "1")
    doomed = launch("cli-doomed", "echo never", "--queue", "--gpus", "1")
    crash = launch("cli-crash", "echo boom-line >&2; exit 3", "--gpu-count", "1")
    after = launch("cli-after", GATED, "--gpu-count", "1")
    assert [(r["state"], r["queue_position"]) for r in (first, doomed, crash, after)] == \
        [("queued", 1), ("queued", 2), ("queued", 3), ("queued", 4)]
    code, table, err = run_cli(inv, "ps", name, capsys=capsys)
    lines = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    assert code == 0 and "queued (1st) for 1 GPU" in lines[first["run_id"]], table
    assert "queued (2nd) for GPU 1" in lines[doomed["run_id"]], table
    code, listing, err = run_cli(inv, "ps", "--queue", name, capsys=capsys)
    head, *rows = listing.splitlines()
    # the stand-in container was not booted by systemd: its queue resumes at the next contact
    assert code == 0 and head == ("{}: 2 GPUs: free none; our runs hold 0-1; 4 queued; after a reboot, resumed at "
                                  "the next dflashctl call".format(name)), listing
    assert [row.split()[:2] for row in rows if "cli-" in row] == [
        ["1st", first["run_id"]], ["2nd", doomed["run_id"]], ["3rd", crash["run_id"]], ["4th", after["run_id"]]]
    code, snapshot, err = run_cli(inv, "watch", name, "--once", "--json", capsys=capsys)
    watched = {run["run_id"]: run for run in snapshot["runs"]}
    assert code == 0 and [watched[r["run_id"]]["queue_position"] for r in (first, doomed, crash, after)] == \
        [1, 2, 3, 4], err
    assert watched[doomed["run_id"]]["state"] == "queued"
    code, said, err = run_cli(inv, "kill", doomed["run_id"], capsys=capsys)
    assert code == 0 and "killed while queued; nothing of it had started" in said, (said, err)
    lab.open_gate(*box, holder["run_id"])
    # first takes GPU 0, the crash GPU 1 and fails; the run behind it takes the GPU the crash gave back
    assert wait_for(lambda: state(lab, box, after["run_id"]).get("state") == "running", 30), \
        [state(lab, box, r["run_id"]) for r in (first, crash, after)]
    code, listed, err = run_cli(inv, "ps", name, "--json", capsys=capsys)
    runs = {run["run_id"]: run for run in listed["runs"]}
    assert runs[crash["run_id"]]["state"] == "failed" and "boom-line" in runs[crash["run_id"]]["error"], runs
    assert runs[first["run_id"]]["state"] == "running" and runs[doomed["run_id"]]["state"] == "killed"
    assert not (run_dir(lab, box, doomed["run_id"]) / "train.log").exists()  # it never started
    code, table, err = run_cli(inv, "ps", name, capsys=capsys)
    lines = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    assert "failed" in lines[crash["run_id"]] and "killed" in lines[doomed["run_id"]], table
    for run in (first, after):
        lab.open_gate(*box, run["run_id"])
    assert wait_for(lambda: all(state(lab, box, r["run_id"]).get("state") == "succeeded" for r in (first, after)),
                    20)
