"""The run lifecycle through the real CLI against the lab: launch, ps, logs, kill, cleanup over SSH + pct."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import runs_dir
from orchestrator.transports.pool import Connections
from tests.lab.lab import ContainerSpec
from tests.lab.procs import ProcInfo
from tests.lab.workloads import run_cli as cli
from tests.lab.workloads import zombie_children
from tests.polling import wait_for

pytestmark = pytest.mark.lab
CT = ("pve1", 200)
TARGET = "pve1/200"


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    return str(lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml"))


def launch(inv: str, capsys, *cmd: str, name: str | None = None, extra: tuple[str, ...] = ()) -> dict:
    args = ["launch", TARGET, "--json", *extra] + (["--name", name] if name else []) + ["--", *cmd]
    code, record, err = cli(inv, *args, capsys=capsys)
    assert code == 0, err
    return record


def run_procs(lab, run_id: str) -> list:
    return [p for p in lab.ct_processes(*CT) if p.environ.get("DFLASH_RUN_ID") == run_id]


def zombies(lab) -> list:
    return [p for p in lab.ct_processes(*CT) if p.state == "Z"]


def wait_state(inv: str, capsys, run_id: str, states: set[str], timeout: float = 15) -> dict:
    """The run's `ps` record once its state is one of `states`, else its last one after `timeout` seconds."""
    seen: list[dict] = []

    def reached() -> bool:
        code, payload, _ = cli(inv, "ps", TARGET, "--all", "--json", capsys=capsys)
        seen.append(next(r for r in payload["runs"] if r["run_id"] == run_id))
        return seen[-1]["state"] in states

    wait_for(reached, timeout, 0.3)
    return seen[-1]


def test_launch_returns_verified_and_the_run_outlives_ssh_and_pct(lab, inv: str, capsys) -> None:
    record = launch(inv, capsys, "python3", "-c", "import time; print('hello', flush=True); time.sleep(60)")
    assert record["state"] == "running" and record["target"] == TARGET and record["pid"]
    # the pct exec and the SSH connection of that launch are gone (main() closed them); the run is not
    assert run_procs(lab, record["run_id"]), "workload died with the session"
    code, out, _ = cli(inv, "logs", record["run_id"], "-n", "5", capsys=capsys)
    assert code == 0 and "hello" in out
    code, result, _ = cli(inv, "kill", record["run_id"], "--grace", "2", "--json", capsys=capsys)
    assert code == 0 and result["targets"][TARGET]["ok"]
    assert run_procs(lab, record["run_id"]) == []


def test_run_survives_dflashctl_killed_right_after_launch(lab, inv: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "--inventory", inv, "launch", TARGET,
                             "--name", "sigkilled", "--", "sleep", "120"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    run_id = proc.stdout.readline().decode().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert run_id.startswith("sigkilled-")
    time.sleep(0.5)
    survivors = run_procs(lab, run_id)
    assert any("sleep" in p.cmdline for p in survivors)
    assert main(["--inventory", inv, "kill", run_id, "--grace", "1"]) == 0


def test_twenty_launches_in_a_row_all_verified_none_hung(lab, inv: str, capsys) -> None:
    ids = []
    for i in range(20):
        started = time.monotonic()
        record = launch(inv, capsys, "sleep", "300", name=f"burst{i}")
        assert record["state"] == "running"
        assert time.monotonic() - started < 10
        ids.append(record["run_id"])
    code, payload, _ = cli(inv, "ps", TARGET, "--json", capsys=capsys)
    live = {r["run_id"] for r in payload["runs"] if r["state"] == "running"}
    assert set(ids) <= live
    code, result, _ = cli(inv, "kill", *ids, "--grace", "1", "--json", capsys=capsys)
    assert code == 0
    assert all(run_procs(lab, r) == [] for r in ids)


FAMILY = r"""
import os, signal, subprocess, sys, time
subprocess.Popen(["sleep", "300"])                                   # a plain child
subprocess.Popen(["setsid", "sh", "-c", "sleep 300 & wait"])          # a grandchild that leaves the session
if os.fork() == 0:                                                   # a child that ignores TERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300)
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)                         # and so does the workload itself
print("family up", flush=True)
time.sleep(300)
"""


def test_kill_leaves_nothing_of_a_family_that_fights_back(lab, inv: str, capsys) -> None:
    record = launch(inv, capsys, "python3", "-c", FAMILY, name="family")
    time.sleep(1.0)
    assert len(run_procs(lab, record["run_id"])) >= 5
    started = time.monotonic()
    code, result, _ = cli(inv, "kill", record["run_id"], "--grace", "2", "--json", capsys=capsys)
    assert code == 0, result
    assert time.monotonic() - started < 2 + 8
    assert run_procs(lab, record["run_id"]) == []
    assert lab.lasting_zombies(*CT) == set()
    run = wait_state(inv, capsys, record["run_id"], {"killed"})
    assert run["state"] == "killed" and run["signal"] == signal.SIGKILL


@pytest.mark.parametrize("cmd, state, exit_code, sig", [
    (["python3", "-c", "import time; time.sleep(1.5)"], "succeeded", 0, None),
    (["python3", "-c", "import time; time.sleep(1.5); raise SystemExit(3)"], "failed", 3, None),
    (["python3", "-c", "import os, signal, time; time.sleep(1.5); os.kill(os.getpid(), signal.SIGSEGV)"],
     "failed", None, signal.SIGSEGV),
])
def test_exit_codes_become_states(lab, inv: str, capsys, cmd, state, exit_code, sig) -> None:
    record = launch(inv, capsys, *cmd)
    run = wait_state(inv, capsys, record["run_id"], {"succeeded", "failed"})
    assert (run["state"], run["exit_code"], run["signal"]) == (state, exit_code, sig)


def test_a_run_that_dies_during_start_up_fails_the_launch_with_its_log(lab, inv: str, capsys) -> None:
    code = main(["--inventory", inv, "launch", TARGET, "--", "python3", "-c",
                 "print('boom coming'); raise RuntimeError('bad config')"])
    err = capsys.readouterr().err
    assert code == 1
    assert "RuntimeError: bad config" in err and "boom coming" in err and "exit code 1" in err


def test_container_reboot_mid_run_is_lost(lab, inv: str, capsys) -> None:
    record = launch(inv, capsys, "sleep", "300", name="reboot")
    lab.pct("pve1", "reboot", "200", check=True)
    run = wait_state(inv, capsys, record["run_id"], {"lost"})
    assert run["state"] == "lost"


def test_gpu_clash_is_refused_unless_forced(lab, inv: str, capsys) -> None:
    first = launch(inv, capsys, "sleep", "300", name="gpu01", extra=("--gpus", "0,1"))
    code, _, err = cli(inv, "launch", TARGET, "--gpus", "1-2", "--", "sleep", "300", capsys=capsys)
    assert code == 1 and first["run_id"] in err
    forced = launch(inv, capsys, "sleep", "300", name="gpu12", extra=("--gpus", "1-2", "--force"))
    assert main(["--inventory", inv, "kill", first["run_id"], forced["run_id"], "--grace", "1"]) == 0


def test_hostile_names_and_arguments_are_inert(lab, inv: str, capsys, tmp_path: Path) -> None:
    for name in ["'; rm -rf /tmp/x; '", "$(touch /tmp/pwned)", "`id`", "a\nb", "../up"]:
        code, _, err = cli(inv, "launch", TARGET, "--name", name, "--", "true", capsys=capsys)
        assert code == 2, (name, err)
    args = ["'; touch /tmp/pwned1; '", "$(touch /tmp/pwned2)", "`touch /tmp/pwned3`", "x\ntouch /tmp/pwned4"]
    record = launch(inv, capsys, "python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *args)
    run = wait_state(inv, capsys, record["run_id"], {"succeeded"})
    assert run["state"] == "succeeded"
    assert main(["--inventory", inv, "logs", record["run_id"]]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == args
    for i in range(1, 5):
        assert lab.ct_run(*CT, ["test", "-e", f"/tmp/pwned{i}"]).returncode != 0
        assert not os.path.exists(f"/tmp/pwned{i}")


@pytest.mark.parametrize("run_id", ["../../etc", "nope-000000", "a/b", "..", "x;y"])
def test_bad_run_ids_are_usage_errors(inv: str, capsys, run_id: str) -> None:
    for command in (["kill", run_id], ["logs", run_id]):
        code, _, err = cli(inv, *command, capsys=capsys)
        assert code == 2, (command, err)
        assert "Traceback" not in err


STUCK = ("import os,time\nfor _ in range(3):\n    os.fork() or os._exit(0)\nprint('stuck', flush=True)\n"
         "time.sleep(300)")


def holding_zombies(lab, tag: str) -> list:
    return [p for p in lab.ct_processes(*CT) if tag in p.cmdline and
            len([z for z in zombies(lab) if z.ppid == p.pid]) == 3]


def plant_stuck_parent(lab, tag: str) -> ProcInfo:
    """A parent no run owns that never waits: its three children become zombies it holds."""
    lab.ct_run(*CT, ["sh", "-c", f"setsid python3 -c \"$0\" {tag} </dev/null >/dev/null 2>&1 &", STUCK])
    found = wait_for(lambda: holding_zombies(lab, tag), 10)
    assert found, "the stuck parent did not plant its zombies"
    return found[0]


def stuck_run_left_behind(lab, inv: str, capsys, tag: str) -> tuple[dict, ProcInfo]:
    """A run whose workload is a stuck parent of three zombies, and whose supervisor was SIGKILLed (the OOM
    killer, say): the workload lives on below the keeper, a real leftover of the run."""
    run = launch(inv, capsys, "python3", "-c", STUCK, tag, name="ender", extra=("--gpus", "none"))
    found = wait_for(lambda: holding_zombies(lab, tag), 10)
    assert found, "the run's stuck parent did not plant its zombies"
    supervisor = run["supervisor_pid"]
    lab.ct_run(*CT, ["kill", "-KILL", str(supervisor)])
    assert wait_for(lambda: not [p for p in lab.ct_processes(*CT) if p.pid == supervisor], 10)  # the keeper reaped it
    return run, found[0]


def test_cleanup_reaps_a_runs_stuck_parent_leaves_a_foreign_one_and_reports_pid1_zombies(lab, inv, capsys):
    ended, ours = stuck_run_left_behind(lab, inv, capsys, "ours-7311")
    foreign = plant_stuck_parent(lab, "foreign-7312")  # no run owns it: never ended, only reported
    # an orphan that exits after its parent: PID 1 inherits it and never reaps it
    lab.ct_run(*CT, ["sh", "-c", "(sleep 0.2 &) ; true"])
    time.sleep(1.0)
    code, plan, _ = cli(inv, "cleanup", TARGET, "--dry-run", "--json", capsys=capsys)
    planned = plan["targets"][TARGET]
    assert code == 0 and [(a["action"], a["run_id"]) for a in planned["actions"]] == [
        ("mark_lost", ended["run_id"]), ("end_stuck_parent", ended["run_id"])]
    assert [z["parent"]["pid"] for z in planned["foreign_zombies"]] == [foreign.pid]
    assert len(zombies(lab)) >= 7  # a dry run changes nothing
    code, done, _ = cli(inv, "cleanup", TARGET, "--json", capsys=capsys)
    report = done["targets"][TARGET]
    ended_parent = [a for a in report["actions"] if a["action"] == "end_stuck_parent"]
    assert code == 0 and ended_parent[0]["pid"] == ours.pid and ended_parent[0]["ok"]
    assert [z["parent"]["pid"] for z in report["foreign_zombies"]] == [foreign.pid]
    assert report["foreign_zombies"][0]["count"] == 3
    time.sleep(0.5)
    left = zombies(lab)
    assert {p.ppid for p in left} == {1, foreign.pid}  # only PID 1's and the foreign parent's remain...
    assert any(p.pid == foreign.pid and p.state != "Z" for p in lab.ct_processes(*CT))  # ...which still runs
    assert "restart" in json.dumps(report["findings"])  # PID 1's are reported with the advice
    lab.ct_run(*CT, ["kill", "-9", str(foreign.pid)])


def test_cleanup_on_the_host_never_plans_to_end_a_containers_pid1(lab, inv: str, capsys) -> None:
    """Seen from the host, a container's PID 1 (here `sleep infinity`, which never reaps) is the parent of
    that container's zombies. It belongs to no run: cleanup lists its zombies and never plans to end it."""
    lab.ct_run(*CT, ["sh", "-c", "(sleep 0.1 &) ; true"])
    init = lab.hosts[CT[0]].containers[CT[1]].init_pid()
    assert wait_for(lambda: zombie_children(init), 5)
    code, plan, err = cli(inv, "cleanup", "local", "--dry-run", "--json", capsys=capsys)
    report = plan["targets"]["local"]
    assert code == 0, err
    assert [a for a in report["actions"] if a.get("pid") == init] == []
    listed = [z for z in report["foreign_zombies"] if z["parent"]["pid"] == init]
    assert len(listed) == 1 and listed[0]["parent"]["cmdline"] == "sleep infinity", report["foreign_zombies"]


def test_cleanup_on_a_host_whose_workdir_is_its_containers_never_touches_their_runs(lab, inv, capsys) -> None:
    """A Proxmox host used as a target with the workdir of its containers (`/workspace` on both): the
    containers' runs carry DFLASH_RUNS_DIR=/workspace/.dflash/runs, as the host's would, and the host sees
    their processes. They are the containers' (another PID and mount namespace): the host's cleanup, run on
    the host over SSH as the agent runs there, plans nothing for them and ends nothing."""
    run = launch(inv, capsys, "sleep", "300", name="inside", extra=("--gpus", "none"))
    runs = run["run_dir"].rsplit("/", 1)[0]
    assert runs == "/workspace/.dflash/runs"
    assert run_procs(lab, run["run_id"])
    top = str(Path(__file__).resolve().parents[2])  # where this orchestrator package lives
    agent = ["env", f"PYTHONPATH={top}", sys.executable, "-m", "dflash_agent", "cleanup", "--runs-dir", runs]
    for dry in (["--dry-run"], []):
        done = subprocess.run(lab.ssh_argv(CT[0]) + [shlex.join(agent + dry)], capture_output=True, text=True,
                              timeout=60)
        report = json.loads(done.stdout.splitlines()[-1])
        assert done.returncode == 0, done.stdout + done.stderr
        assert [a for a in report["actions"] if a.get("run_id") == run["run_id"]] == [], report["actions"]
        assert [a for a in report["actions"] if a["action"].startswith("end_")] == [], report["actions"]
        # nor does it take them for strangers here that claim a run: they are not here at all
        assert [f for f in report["findings"] if f["kind"] == "unproven_run_processes"] == [], report["findings"]
    assert run_procs(lab, run["run_id"]) and wait_state(inv, capsys, run["run_id"], {"running"})["state"] == "running"
    code, result, err = cli(inv, "kill", run["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0, err


def test_a_keeper_that_leaves_after_its_idle_time_leaves_no_zombie(lab, tmp_path, capsys) -> None:
    """Containers here have a PID 1 that never reaps. A keeper started the way dflashctl starts it (sshd, a
    shell, pct exec, the agent's launch) leaves after its idle time (1 s here) without a zombie behind."""
    ctid = 205  # a container of its own: no other test's zombies in it
    lab.add_container("pve1", ContainerSpec(ctid))
    try:
        inv = str(lab.write_inventory(tmp_path / "inventory.yaml"))
        target = load_inventory(Path(inv)).target(f"pve1/{ctid}")
        with Connections() as conns:
            agent = RunClient(load_inventory(Path(inv)), conns).deploy(target, with_trainer=False).agent_path
        runs = runs_dir(target)
        argv = [lab.hosts["pve1"].pct_command, "exec", str(ctid), "--", target.python, agent, "launch",
                "--runs-dir", runs, "--run-id", "brief", "--name", "brief", "--target", target.name,
                "--settle", "0.1", "--keeper-idle", "1", "--", "sleep", "0.5"]
        done = subprocess.run(lab.ssh_argv("pve1") + [shlex.join(argv)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        info = lab.ct_run("pve1", ctid, ["cat", f"{runs}/.keeper/keeper.json"], text=True).stdout
        keeper = lambda: [p for p in lab.ct_processes("pve1", ctid) if p.pid == json.loads(info)["pid"]]  # noqa: E731
        assert keeper()
        assert wait_for(lambda: not keeper(), 30), keeper()  # gone: exited and reaped, not PID 1's zombie
        assert [p for p in lab.ct_processes("pve1", ctid) if p.state == "Z"] == []
        code, report, err = cli(inv, "cleanup", f"pve1/{ctid}", "--json", capsys=capsys)
        result = report["targets"][f"pve1/{ctid}"]
        assert code == 0 and result["ok"], err
        assert [f for f in result["findings"] if "zombies" in f["kind"]] == [] and result["foreign_zombies"] == []
    finally:
        lab.remove_container("pve1", ctid)


def test_fifty_launch_kill_cycles_leave_no_zombie(lab, inv: str) -> None:
    from orchestrator.runs.spec import LaunchSpec

    inventory = load_inventory(Path(inv))
    target = inventory.target(TARGET)
    before = lab.zombies(*CT)
    with Connections() as conns:
        client = RunClient(inventory, conns)
        for i in range(50):
            spec = LaunchSpec(target=target, name=f"cycle{i}", settle=0.1,
                              command=["sh", "-c", "sleep 300 & sleep 300 & wait"])
            record = client.launch(spec)
            result = client.kill(target, [record.run_id], grace=1)
            assert result.ok, result
    assert lab.lasting_zombies(*CT, besides=before) == set()  # none added (PID 1 here never reaps: any leak would stay)
