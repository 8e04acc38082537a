"""What the CLI must refuse or say instead of guessing or claiming (issue 44): a line count no tail can count, a
cleanup of a host it never reached, a name two live runs carry, an inventory that silently beats
$DFLASHCTL_INVENTORY, a dashboard drawn into a pipe."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.lab.workloads import run_cli, write_local_inventory

ROOT = Path(__file__).resolve().parents[3]


def launch(inv: str, capsys, *args: str) -> tuple[dict, str]:
    code, record, err = run_cli(inv, "launch", "local", "--json", "--gpus", "none", *args, capsys=capsys)
    assert code == 0, err
    return record, err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_logs_with_a_line_count_past_any_tail_is_one_usage_line(inv, capsys) -> None:
    record, _ = launch(inv, capsys, "--", "sh", "-c", "echo hello; sleep 60")
    try:
        code, out, err = run_cli(inv, "logs", record["run_id"], "-n", "18446744073709551616", capsys=capsys)
        assert code == 2 and out == "", out
        first = err.splitlines()[0]  # then, as for every option typed wrong, the usage hint
        assert first.startswith("dflashctl: error: ") and "Traceback" not in err, err
        assert "'--lines'" in first and "got 18446744073709551616" in first, err
        code, out, err = run_cli(inv, "logs", record["run_id"], "-n", "1000000000000", capsys=capsys)
        assert code == 0 and out.strip() == "hello", err  # the largest count allowed still works
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_cleanup_of_a_host_it_could_not_reach_never_says_nothing_to_clean(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  dead:\n    address: 127.0.0.1\n    port: {closed_port()}\n")
    for args in (["--dry-run"], []):
        code, out, err = run_cli(str(inventory), "cleanup", "dead", *args, capsys=capsys)
        assert code == 3, err
        assert out == "" and "nothing to clean" not in err, out + err
        assert err.splitlines()[-1].startswith("dflashctl: error: dead: cannot connect"), err  # as every error


def test_kill_refuses_a_name_two_live_runs_carry_and_launch_warns(inv, capsys) -> None:
    first, err = launch(inv, capsys, "--name", "dup", "--", "sleep", "60")
    assert "already named" not in err
    second, err = launch(inv, capsys, "--name", "dup", "--", "sleep", "60")
    try:
        assert f"warning: a live run is already named 'dup': {first['run_id']}" in err, err
        code, out, err = run_cli(inv, "kill", "dup", "--grace", "1", capsys=capsys)
        assert code == 2 and out == "", out
        assert len(err.strip().splitlines()) == 1 and "'dup' names 2 live runs" in err, err
        assert first["run_id"] in err and second["run_id"] in err
        code, listing, _ = run_cli(inv, "ps", "--json", capsys=capsys)
        states = {r["run_id"]: r["state"] for r in listing["runs"]}
        assert states[first["run_id"]] == states[second["run_id"]] == "running"  # nothing was stopped
    finally:
        run_cli(inv, "kill", first["run_id"], second["run_id"], "--grace", "1", capsys=capsys)


def test_an_inventory_here_that_beats_the_exported_one_is_said(tmp_path: Path, monkeypatch, capsys) -> None:
    here = tmp_path / "project"
    here.mkdir()
    write_local_inventory(here / "inventory.yaml", tmp_path / "work")
    exported = write_local_inventory(tmp_path / "exported.yaml", tmp_path / "other-work")
    monkeypatch.chdir(here)
    monkeypatch.setenv("DFLASHCTL_INVENTORY", exported)
    from orchestrator.cli import main

    code = main(["ps"])
    err = capsys.readouterr().err
    assert code == 0
    assert f"note: using {here / 'inventory.yaml'}" in err and exported in err, err
    code = main(["doctor", "local", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert payload["inventory"] == {"path": str(here / "inventory.yaml"), "source": "./inventory.yaml"}
    main(["doctor", "local"])
    assert f"inventory: {here / 'inventory.yaml'} (./inventory.yaml)" in capsys.readouterr().out
    monkeypatch.setenv("DFLASHCTL_INVENTORY", str(here / "inventory.yaml"))  # the same file: nothing to say
    assert main(["ps"]) == 0 and "note:" not in capsys.readouterr().err


def test_watch_with_stdout_not_a_terminal_refuses_in_one_line(inv) -> None:
    env = {key: value for key, value in os.environ.items() if key != "TEXTUAL_DRIVER"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "orchestrator", "--inventory", inv, "watch", "local"],
                          capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == b"", done.stdout[:300]
    err = done.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and err.startswith("dflashctl: error: ") and "--once" in err, err
