"""cleanup and kill on the `local` target, on a machine that is not only ours: another program's processes
beside the runs (cleanup must never end them), and a workdir with no free byte left (kill must still end
everything)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.dflash_agent.pidns import host_processes_with
from tests.lab.workloads import (run_cli, start_foreign_stuck_parent, stop_keeper, write_local_inventory,
                                 zombie_children)
from tests.polling import wait_for


def launch(inv: str, capsys, *args: str) -> dict:
    code, record, err = run_cli(inv, "launch", "local", "--json", *args, capsys=capsys)
    assert code == 0, err
    return record


@pytest.fixture
def foreign_stuck_parent():
    proc = start_foreign_stuck_parent()
    yield proc
    proc.kill()
    proc.wait()


def test_cleanup_never_plans_to_end_a_process_no_run_owns(inv, capsys, foreign_stuck_parent):
    # A dry run only: on the old code the real one would end whatever else on this machine holds zombies.
    run = launch(inv, capsys, "--name", "beside", "--", "sleep", "60")
    foreign = foreign_stuck_parent.pid
    code, plan, err = run_cli(inv, "cleanup", "local", "--dry-run", "--json", capsys=capsys)
    assert code == 0, err
    report = plan["targets"]["local"]
    assert [a for a in report["actions"] if a.get("pid") == foreign] == []
    assert all(a.get("run_id") for a in report["actions"])  # whatever it plans belongs to a run
    listed = [z for z in report["foreign_zombies"] if z["parent"]["pid"] == foreign]
    assert len(listed) == 1, report["foreign_zombies"]
    assert listed[0]["parent"]["cmdline"] == "sleep 301" and listed[0]["pids"] == zombie_children(foreign)
    code, text, _ = run_cli(inv, "cleanup", "local", "--dry-run", capsys=capsys)
    assert code == 0
    assert f"zombie(s) of pid {foreign} (sleep 301), which no dflashctl run owns: left alone" in text
    assert "restart of that container" in text
    assert foreign_stuck_parent.poll() is None
    code, result, _ = run_cli(inv, "kill", run["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and result["targets"]["local"]["runs"][0]["state"] == "killed"


def test_cleanup_gives_its_advice_on_foreign_zombies_once_however_many_parents(inv, capsys):
    parents = [start_foreign_stuck_parent() for _ in range(3)]
    try:
        code, text, err = run_cli(inv, "cleanup", "local", "--dry-run", capsys=capsys)
        code_json, plan, _ = run_cli(inv, "cleanup", "local", "--dry-run", "--json", capsys=capsys)
    finally:
        for proc in parents:
            proc.kill()
            proc.wait()
    assert code == 0 and code_json == 0, err
    for proc in parents:  # each parent its own line
        assert f"zombie(s) of pid {proc.pid} (sleep 301), which no dflashctl run owns: left alone" in text, text
    advice = plan["targets"]["local"]["foreign_zombies"][0]["advice"]
    assert "restart of that container" in advice and text.count(advice) == 1, text


@pytest.fixture
def full_workdir(tmp_path: Path):
    """A workdir on its own small tmpfs (filled by the test with fill()), and an inventory for it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(work)], check=True)
    try:
        yield write_local_inventory(tmp_path / "inventory.yaml", work), work
    finally:
        stop_keeper(work / ".dflash" / "runs")
        subprocess.run(["umount", "-l", str(work)], check=False)


def fill(directory: Path, *logs: Path) -> None:
    """Take every free byte of the filesystem of `directory`, then the room left in the last page of each of
    `logs` (a tmpfs file grows by whole pages: until its page is full, appending needs no free byte)."""
    for path, chunk in ((directory / "ballast", 65536),) + tuple((log, 1) for log in logs):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
    assert os.statvfs(directory).f_bavail == 0


# Ignores TERM (and its children inherit that): only a KILL after the grace ends it.
STUBBORN = "trap '' TERM; sleep 300 & sleep 300 & wait"


def launch_stubborn(inv: str, capsys, work: Path) -> tuple:
    run = launch(inv, capsys, "--name", "stubborn", "--", "sh", "-c", STUBBORN)
    runs = str(work / ".dflash" / "runs")
    assert wait_for(lambda: len(host_processes_with(runs, run["run_id"])) == 3, 5)
    return run, runs


def keeper_alive(runs: str) -> bool:
    info = json.loads(Path(runs, ".keeper", "keeper.json").read_text())
    try:
        return Path(f"/proc/{info['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_on_a_full_disk_ends_the_run_within_its_grace_and_records_it(full_workdir, capsys):
    inv, work = full_workdir
    run, runs = launch_stubborn(inv, capsys, work)
    fill(work)
    started = time.monotonic()
    code, result, err = run_cli(inv, "kill", run["run_id"], "--grace", "1", "--json", capsys=capsys)
    elapsed = time.monotonic() - started
    assert code == 0 and "Traceback" not in err, err
    killed = result["targets"]["local"]["runs"][0]
    assert killed["ok"] and killed["survivors"] == [] and killed["state"] == "killed", killed
    assert "state_error" not in killed  # the run's reserve made room for its end
    assert elapsed < 8  # our grace of 1 s, not the run's 30 s the supervisor would wait on its own
    assert host_processes_with(runs, run["run_id"]) == []
    state = json.loads(Path(runs, run["run_id"], "state.json").read_text())
    assert state["state"] == "killed" and "disk full" in state["error"]


def test_kill_says_so_when_not_even_the_reserve_can_record_the_end(full_workdir, capsys):
    inv, work = full_workdir
    run, runs = launch_stubborn(inv, capsys, work)
    Path(runs, run["run_id"], ".state-reserve").unlink()
    fill(work, Path(runs, ".keeper", "keeper.log"))
    supervisor = json.loads(Path(runs, run["run_id"], "state.json").read_text())["supervisor_pid"]
    code, out, err = run_cli(inv, "kill", run["run_id"], "--grace", "1", capsys=capsys)
    assert code == 0 and "Traceback" not in err, err
    assert out.startswith(f"{run['run_id']} on local: killed") and "could not be recorded" in out, out
    assert "No space left on device" in out
    assert host_processes_with(runs, run["run_id"]) == []
    # the keeper reaped the supervisor and could not log it: that must not end the reaper of every run
    assert wait_for(lambda: not Path(f"/proc/{supervisor}").exists(), 5)
    assert keeper_alive(runs)
