"""cleanup and kill on the `local` target, on a machine that is not only ours: another program's processes
beside the runs (cleanup must never end them), and a workdir with no free byte left (kill must still end
everything)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.lab.workloads import run_cli, start_foreign_stuck_parent, stop_keeper, zombie_children


def write_inventory(path: Path, workdir: Path) -> str:
    path.write_text("hosts:\n  local:\n    transport: local\n"
                    f"    workdir: {json.dumps(str(workdir))}\n    python: {json.dumps(sys.executable)}\n")
    return str(path)


@pytest.fixture
def inv(tmp_path: Path):
    yield write_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    stop_keeper(tmp_path / "work" / ".dflash" / "runs")


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
