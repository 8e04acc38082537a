"""The lab's tests again on real, unprivileged LXC containers (tests/lab/lxclab.py), with `lab` the LXC lab: the
same bodies as test_lab_lifecycle.py (launch + ps + logs + kill, a family that fights back, cleanup under a PID 1
that never reaps, reboot), test_watch_live.py (the live source) and test_lab.py (pct exec's habits), and what only
a real container shows: a supervisor OOM-killed by the memory cgroup, /dev/shm gone after a reboot, doctor on a
real cgroup, pct exec's two environment modes, a reaping PID 1 beside one that never reaps, and a container booted
as systemd boots one (tests/lab/systemd_init.py) whose GPU queue resumes at boot with no dflashctl call."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.lab import test_lab as stand_in
from tests.lab.lab import ContainerSpec, ct_config
from tests.lab.lxclab import OOM_MEMORY_MIB, SYSTEMD_INIT
from tests.lab.workloads import run_cli as cli
from tests.on_lab import test_lab_lifecycle as lifecycle
from tests.on_lab import test_watch_live as watch_live
from tests.lab.workloads import GATED
from tests.on_lab.test_lab_queue import agent, queue_args, state
# their fixtures, here on the LXC lab
from tests.on_lab.test_lab_lifecycle import inv  # noqa: F401
from tests.on_lab.test_watch_live import inventory, launched, source  # noqa: F401
from orchestrator.runs.spec import runs_dir
from tests.polling import wait_for

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(lxc_lab):
    return lxc_lab


test_launch_ps_logs_kill_on_lxc = lifecycle.test_launch_returns_verified_and_the_run_outlives_ssh_and_pct
test_kill_of_a_family_that_fights_back_on_lxc = lifecycle.test_kill_leaves_nothing_of_a_family_that_fights_back
test_cleanup_under_a_non_reaping_pid1_on_lxc = \
    lifecycle.test_cleanup_reaps_a_runs_stuck_parent_leaves_a_foreign_one_and_reports_pid1_zombies
test_reboot_mid_run_is_lost_on_lxc = lifecycle.test_container_reboot_mid_run_is_lost


OOM_CT, OOM_TARGET = ("pve1", 202), "pve1/202"
# waits for the test's go, then grows by 8 MiB every 20 ms until the memory cgroup's OOM killer steps in
GROW = ("import os, time\n"
        "while not os.path.exists('/workspace/oom-go'): time.sleep(0.05)\n"
        "held = []\n"
        "while True:\n    held.append(bytearray(8 << 20)); time.sleep(0.02)\n")


def oom_kills(host_pid: int) -> int:
    """How many processes the memory cgroup of host_pid's container has OOM-killed (cgroup v1 or v2)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()]
    memory = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    if memory:
        text = Path(f"/sys/fs/cgroup/memory{memory[0]}/memory.oom_control").read_text()
    else:
        text = Path(f"/sys/fs/cgroup{[p for _, c, p in lines if c == ''][0]}/memory.events").read_text()
    return int(dict(line.split() for line in text.splitlines())["oom_kill"])


def run_state(inv: str, capsys, target: str, run_id: str) -> str:
    code, payload, _ = cli(inv, "ps", target, "--all", "--json", capsys=capsys)
    return next(r["state"] for r in payload["runs"] if r["run_id"] == run_id)


def test_a_supervisor_oom_killed_by_the_memory_cgroup_leaves_its_run_lost(lab, inv: str, capsys) -> None:
    code, record, err = cli(inv, "launch", OOM_TARGET, "--json", "--gpus", "none", "--", "python3", "-c", GROW,
                            capsys=capsys)
    assert code == 0, err
    supervisor = next(p for p in lab.ct_processes(*OOM_CT)
                      if "supervise" in p.cmdline and record["run_id"] in " ".join(p.cmdline))
    Path(f"/proc/{supervisor.host_pid}/oom_score_adj").write_text("1000")  # the OOM killer's first choice
    init = lab.hosts[OOM_CT[0]].containers[OOM_CT[1]].init_pid()
    before = oom_kills(init)
    lab.ct_run(*OOM_CT, ["touch", "/workspace/oom-go"])
    try:
        assert wait_for(lambda: all(p.pid != supervisor.pid for p in lab.ct_processes(*OOM_CT)), 30)
        assert oom_kills(init) > before  # the kernel's OOM killer ended it, nobody else
        assert wait_for(lambda: run_state(inv, capsys, OOM_TARGET, record["run_id"]) == "lost", 20)
    finally:
        lab.ct_run(*OOM_CT, ["rm", "-f", "/workspace/oom-go"])
        cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_reboot_wipes_dev_shm_keeps_workspace_and_the_run_is_lost(lab, inv: str, capsys) -> None:
    record = lifecycle.launch(inv, capsys, "sleep", "300", name="shm")
    lab.ct_run(*lifecycle.CT, ["sh", "-c", "echo kept > /dev/shm/marker && echo kept > /workspace/marker"])
    before = lab.hosts["pve1"].containers[200].init_pid()
    lab.pct("pve1", "reboot", "200", check=True)
    assert lifecycle.wait_state(inv, capsys, record["run_id"], {"lost"})["state"] == "lost"
    assert lab.hosts["pve1"].containers[200].init_pid() not in (None, before)
    assert lab.ct_run(*lifecycle.CT, ["cat", "/dev/shm/marker"]).returncode != 0
    assert lab.ct_run(*lifecycle.CT, ["cat", "/workspace/marker"], text=True).stdout == "kept\n"


@pytest.mark.parametrize("host, ctid, kept", [("pve1", 200, True), ("pve2", 300, False)])
def test_pct_exec_keeps_or_clears_the_callers_environment(lab, host: str, ctid: int, kept: bool) -> None:
    pct = lab.hosts[host].pct_command
    result = subprocess.run([*lab.ssh_argv(host), f"DFLASH_PROBE=1 {pct} exec {ctid} -- env"],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert result.returncode == 0 and env["container"] == "lxc", result.stderr
    assert ("DFLASH_PROBE" in env) is kept
    if not kept:  # lxc-attach --clear-env: its own PATH, no HOME
        assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" and "HOME" not in env


def test_a_reaping_pid1_leaves_no_zombie_a_non_reaping_one_does(lab) -> None:
    for ctid in (202, 200):
        lab.ct_run("pve1", ctid, ["sh", "-c", "(sleep 0.1 &) ; true"])
    assert wait_for(lambda: [p for p in lab.ct_processes("pve1", 200) if p.state == "Z" and p.ppid == 1], 5)
    time.sleep(0.5)
    assert [p for p in lab.ct_processes("pve1", 202) if p.state == "Z"] == []
    assert [p.cmdline for p in lab.ct_processes("pve1", 202) if p.pid == 1] == [
        ["/usr/bin/python3", "/opt/lab/bin/reaping-init"]]


def test_doctor_reads_the_memory_cgroup_and_pct_status_of_a_real_container(lab, inv: str, capsys) -> None:
    code, payload, err = cli(inv, "doctor", OOM_TARGET, "pve2/300", "--json", capsys=capsys)
    gpu = {row["name"]: row["status"] for row in payload["targets"]["pve2/300"]["checks"]}
    # a GPU container as docs/proxmox.md prepares it: the CT config's device rules and binds, the driver twice
    assert gpu == dict.fromkeys(("reach", "compile_cache", "nvidia_smi", "driver", "device_nodes", "ct_config",
                                 "gpus_held", "shm", "workdir", "limits"), "ok"), err
    checks = {row["name"]: row for row in payload["targets"][OOM_TARGET]["checks"]}
    assert checks["reach"]["status"] == "ok" and "container 202 running" in checks["reach"]["detail"], err
    assert checks["shm"]["status"] == "ok" and checks["workdir"]["status"] == "ok"
    # the limit the container's memory cgroup really has (the stand-in has none)
    assert checks["limits"]["status"] == "warn" and f"{OOM_MEMORY_MIB} MiB of" in checks["limits"]["detail"]
    assert "`pct set 202 --memory" in checks["limits"]["fix"]
    lab.pct("pve1", "stop", "202", check=True)
    try:
        code, payload, err = cli(inv, "doctor", OOM_TARGET, "--json", capsys=capsys)
        report = payload["targets"][OOM_TARGET]
        assert code != 0 and report["container"] == "stopped" and "pct start 202" in report["error"], report
    finally:
        lab.pct("pve1", "start", "202", check=True)


# the live source of `watch`: runs on both hosts (pve2's pct exec clears the environment), their log lines, a kill
test_watch_updates_runs_of_two_hosts_live_on_lxc = watch_live.test_runs_of_two_hosts_update_live
test_watch_kill_and_log_lines_on_lxc = watch_live.test_kill_and_log_lines_through_the_source
test_closing_watch_ends_every_agent_and_nvidia_smi_on_lxc = \
    watch_live.test_closing_the_source_ends_every_agent_and_nvidia_smi

# what the pct stand-in does as lxc-attach does (tests/lab/test_lab.py), checked on lxc-attach itself
test_command_stays_in_pcts_process_group_and_session_on_lxc = \
    stand_in.test_command_stays_in_pcts_process_group_and_session
test_plain_background_child_survives_the_command_on_lxc = \
    stand_in.test_plain_background_child_survives_the_command_under_pid1
test_background_child_holding_stdout_keeps_the_session_open_on_lxc = \
    stand_in.test_background_child_holding_stdout_keeps_the_session_open
test_hangup_or_term_to_pct_ends_pct_alone_on_lxc = stand_in.test_hangup_or_term_to_pct_ends_pct_alone


SYSTEMD_BOX = ("pve1", 203)


@pytest.fixture(scope="module")
def systemd_inv(lab, tmp_path_factory):
    """pve1's CT 203: one GPU, PID 1 the lab's systemd-init (a writable /etc/systemd/system, /run/systemd/system)."""
    lab.add_container(SYSTEMD_BOX[0], ContainerSpec(SYSTEMD_BOX[1], gpus=1,
                                                    config=ct_config(SYSTEMD_BOX[1], 1, extra=(SYSTEMD_INIT,))))
    try:
        yield str(lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml"))
    finally:
        lab.remove_container(*SYSTEMD_BOX)


def test_a_reboot_of_a_systemd_container_resumes_its_queue_at_boot_with_no_dflashctl_call(lab, systemd_inv):
    box = SYSTEMD_BOX
    holder = agent(systemd_inv, box, lambda t: queue_args(t, "boot-hold", GATED))["run"]
    waiting = [agent(systemd_inv, box, lambda t, i=i: queue_args(t, f"boot-wait-{i}", "echo up; sleep 0.3"))["run"]
               for i in range(3)]
    assert holder["state"] == "running" and [w["queue_position"] for w in waiting] == [1, 2, 3]
    units = lab.hosts[box[0]].containers[box[1]].dir / "systemd"  # the container's /etc/systemd/system
    assert [p.name for p in (units / "multi-user.target.wants").iterdir()] == [
        p.name for p in units.glob("dflash-queue-*.service")], sorted(units.rglob("*"))
    answer = agent(systemd_inv, box, lambda t: ["queue", "--runs-dir", runs_dir(t)])
    assert answer["resumes_at_boot"] is True
    assert agent(systemd_inv, ("pve1", 200), lambda t: ["queue", "--runs-dir", runs_dir(t)])["resumes_at_boot"] is False
    lab.pct(box[0], "reboot", str(box[1]), check=True)
    # from here on, only the container's files as the host sees them: no agent call, no pct exec
    init = lab.hosts[box[0]].containers[box[1]].init_pid()
    journal = Path(f"/proc/{init}/root/run/lab-units.log")
    assert wait_for(lambda: all(state(lab, box, w["run_id"]).get("state") == "succeeded" for w in waiting), 30), (
        [state(lab, box, w["run_id"]) for w in waiting], journal.read_text() if journal.exists() else "no journal")
    assert "exit 0" in journal.read_text()
    assert state(lab, box, "boot-hold")["state"] != "succeeded"  # it ran at the reboot: nothing restarted it
