"""The CLI on the `local` target with real launched runs: addressing by name and prefix, a second kill, a
command that cannot start, GPUs the machine does not have, inputs that used to end in a traceback."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from dflash_records.step import StepRecord
from tests.lab.workloads import run_cli, stop_keeper

NO_GPU_PATH = "/usr/bin:/bin"  # no nvidia-smi there on a machine without GPUs: checked below


def launch(inv: str, capsys, *args: str) -> dict:
    code, record, err = run_cli(inv, "launch", "local", "--json", *args, capsys=capsys)
    assert code == 0, err
    return record


def test_logs_and_kill_address_a_run_by_its_name_and_by_a_prefix(inv, capsys):
    first = launch(inv, capsys, "--name", "ticker", "--", "sh", "-c", "echo first; sleep 60")
    time.sleep(1.1)  # ids carry the second they were made in
    second = launch(inv, capsys, "--name", "ticker", "--", "sh", "-c", "echo second; sleep 60")
    code, out, err = run_cli(inv, "logs", "ticker", capsys=capsys)
    assert code == 0 and out.strip() == "second"
    assert "'ticker' names 2 runs" in err and second["run_id"] in err
    code, out, err = run_cli(inv, "logs", first["run_id"][:-2], capsys=capsys)  # a unique prefix
    assert code == 0 and out.strip() == "first"
    code, out, err = run_cli(inv, "logs", "ticker-", capsys=capsys)  # a prefix of both
    assert code == 2 and first["run_id"] in err and second["run_id"] in err and "Traceback" not in err
    # kill does not guess between two live runs of one name: it lists them
    code, out, err = run_cli(inv, "kill", "ticker", "--grace", "1", capsys=capsys)
    assert code == 2 and "'ticker' names 2 live runs" in err and first["run_id"] in err and second["run_id"] in err
    code, result, err = run_cli(inv, "kill", second["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and [r["run_id"] for r in result["targets"]["local"]["runs"]] == [second["run_id"]]
    # with the newest one ended, the name means the other, still live one
    code, result, err = run_cli(inv, "kill", "ticker", "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and [r["run_id"] for r in result["targets"]["local"]["runs"]] == [first["run_id"]]
    code, out, err = run_cli(inv, "logs", "nosuch", capsys=capsys)
    assert code == 2 and "no run or job 'nosuch'" in err


def test_a_second_kill_says_the_run_had_already_ended(inv, capsys):
    record = launch(inv, capsys, "--", "sleep", "60")
    code, out, _ = run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)
    assert code == 0 and out.strip() == f"{record['run_id']} on local: killed, signal 15 (SIGTERM)"
    code, out, err = run_cli(inv, "kill", record["run_id"], capsys=capsys)
    assert code == 0
    assert out.strip() == f"{record['run_id']} on local: had already ended: killed, signal 15 (SIGTERM); nothing to stop"
    assert "stopping" not in err  # nothing is: the line above says why


def test_a_command_that_ends_during_the_launch_is_said_to_have_ended(inv, capsys):
    code, out, err = run_cli(inv, "launch", "local", "--gpus", "none", "--", "true", capsys=capsys)
    assert code == 0, err
    run_id = out.strip()
    assert f"{run_id} on local already ended: succeeded, exit code 0" in err and "is succeeded" not in err
    code, out, err = run_cli(inv, "cleanup", "local", capsys=capsys)
    first = out.splitlines()[0]  # the lines after it describe what cleanup found on this machine
    assert code == 0 and "(s)" not in first
    assert first in ("local: nothing to clean", "local: 1 action taken") or first.endswith(" actions taken"), out


def test_a_launch_that_fails_says_so_once(inv, capsys):
    code, out, err = run_cli(inv, "launch", "local", "--gpus", "none", "--", "sh", "-c", "echo oops; exit 3",
                             capsys=capsys)
    assert code == 1
    assert err.count("exit code 3") == 1, err
    assert "oops" in err  # the log's last lines, above the error


def test_a_missing_binary_fails_the_launch_with_exit_127_command_not_found(inv, capsys):
    code, out, err = run_cli(inv, "launch", "local", "--", "no-such-program-here", capsys=capsys)
    assert code == 1
    assert "failed, exit code 127: command not found: no-such-program-here" in err
    assert "None" not in err


def test_gpus_the_machine_does_not_have_are_refused_before_anything_starts(inv, capsys, monkeypatch):
    monkeypatch.setenv("PATH", NO_GPU_PATH)
    if any(os.path.exists(os.path.join(d, "nvidia-smi")) for d in NO_GPU_PATH.split(":")):
        pytest.skip("this machine has nvidia-smi")
    code, _, err = run_cli(inv, "launch", "local", "--gpus", "0-3", "--", "sleep", "60", capsys=capsys)
    assert code == 2 and "local has no GPU" in err
    started = time.monotonic()
    code, _, err = run_cli(inv, "launch", "local", "--gpus", "0-99999999", "--", "sleep", "60", capsys=capsys)
    assert code == 2 and "GPU indices go up to 1023" in err and time.monotonic() - started < 1.0
    code, payload, _ = run_cli(inv, "ps", "--json", capsys=capsys)
    assert payload["runs"] == []  # nothing was started


def test_the_inventory_gpu_count_bounds_gpus_too(tmp_path, capsys):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  local:\n    transport: local\n    gpus: 2\n    workdir: {json.dumps(str(tmp_path))}\n")
    code, _, err = run_cli(str(path), "launch", "local", "--gpus", "1-2", "--", "true", capsys=capsys)
    assert code == 2 and "local has 2 GPU(s) (0-1) in the inventory" in err


def test_a_run_that_uses_no_gpu_launches_beside_training_with_gpus_none(tmp_path, capsys):
    """docs/watch.md's notifier beside a training run: `--gpus none` is refused by nothing, sees no GPU, and what
    stops a run without --gpus says how to ask for it."""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  local:\n    transport: local\n    gpus: 2\n    workdir: {json.dumps(str(tmp_path / 'w'))}\n"
                    f"    python: {json.dumps(sys.executable)}\n")
    try:
        launch(str(path), capsys, "--gpus", "0-1", "--name", "train", "--", "sleep", "60")
        notifier = launch(str(path), capsys, "--gpus", "NONE", "--name", "notifier", "--",
                          "sh", "-c", "echo visible=${CUDA_VISIBLE_DEVICES-unset}.; sleep 60")
        assert notifier["gpus"] == []
        deadline = time.monotonic() + 5
        while True:   # the launch returns once the run is verified, maybe before its first line
            code, out, _ = run_cli(str(path), "logs", "notifier", capsys=capsys)
            if out.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert code == 0 and out.strip() == "visible=."
        code, _, err = run_cli(str(path), "launch", "local", "--name", "all", "--", "sleep", "60", capsys=capsys)
        assert code == 1 and "GPUs already held by a live run" in err and "--gpus none" in err
        assert "--gpus none for a run that uses no GPU" in err   # the warning before it, too
        code, _, err = run_cli(str(path), "launch", "local", "--gpus", "nothing", "--", "true", capsys=capsys)
        assert code == 2 and "or none" in err
    finally:
        run_cli(str(path), "kill", "train", "notifier", "--grace", "1", capsys=capsys)
        stop_keeper(tmp_path / "w" / ".dflash" / "runs")


def test_a_huge_invalid_name_is_not_echoed_whole(inv, capsys):
    name = "x" * 100_000 + "!"
    code, out, err = run_cli(inv, "launch", "local", "--name", name, "--", "true", capsys=capsys)
    assert code == 2 and "invalid run name" in err and len(err) < 1000
    code, out, err = run_cli(inv, "logs", name, capsys=capsys)
    assert code == 2 and "invalid run id" in err and len(err) < 1000


def test_an_env_value_that_is_not_utf8_reaches_the_run_as_typed(inv, capsys):
    record = launch(inv, capsys, "--env", "V=\udcff", "--", sys.executable, "-c",
                    "import os, sys; sys.stdout.buffer.write(os.environb[b'V']); sys.stdout.flush()")
    deadline = time.monotonic() + 10
    while Path(record["log_path"]).read_bytes() != b"\xff" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert Path(record["log_path"]).read_bytes() == b"\xff"


def test_version(inv, capsys):
    code, payload, _ = run_cli(inv, "version", "--json", capsys=capsys)
    assert code == 0 and payload["dflashctl"] and payload["agent_version"] and payload["python"]
    local = payload["local"]
    assert local["python"] == sys.version.split()[0] and local["executable"] == sys.executable
    for package in ("torch", "transformers"):  # what that Python would train with, or None
        try:
            from importlib.metadata import version
            expected = version(package)
        except Exception:
            expected = None
        assert local[package] == expected


def test_version_never_imports_torch_in_the_controller(inv):
    import subprocess

    probe = ("import sys; from orchestrator.cli import main; code = main(['--inventory', sys.argv[1], 'version']); "
             "print('torch' in sys.modules, 'transformers' in sys.modules, code)")
    done = subprocess.run([sys.executable, "-c", probe, inv], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.stdout.splitlines()[-1] == "False False 0", done.stderr
    assert done.stdout.startswith("dflashctl ")


def test_watch_once_json_shows_the_tree_tau_of_a_runs_step_lines(inv, capsys):
    def line(step: int, **taus) -> str:
        return StepRecord(
            elapsed_s=60.0 * step, step=step, loss=3.0, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
            tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=1000.0, q_pre=[1], q_hs=[], epoch=0.0, eta_s=60.0,
            **taus).to_line()

    lines = [line(2, tau_replay=2.5), line(3, tau_heldout=1.8, tau_tree_heldout={8: 2.41, 32: 2.93, 64: 3.02}),
             line(4, tau_replay=2.6)]
    record = launch(inv, capsys, "--name", "trees", "--", "sh", "-c", 'printf "%s\\n" "$@"; sleep 60', "sh", *lines)
    deadline = time.monotonic() + 60
    while True:
        code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", capsys=capsys)
        run = next(r for r in snapshot["runs"] if r["run_id"] == record["run_id"])
        if run["last_step"] == 4:
            break
        assert time.monotonic() < deadline, (run, err)
        time.sleep(0.2)
    # (budget, τ) pairs, smallest budget first; a later line without them keeps the evaluation's figures
    assert run["tau_tree_heldout"] == [[8, 2.41], [32, 2.93], [64, 3.02]] and run["tau_heldout"] == 1.8
    assert [point["tau_tree_heldout"] for point in run["history"]] == [[], [[8, 2.41], [32, 2.93], [64, 3.02]], []]
    code, _, err = run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)
    assert code == 0, err


SLOW_START_S = 35  # past the 30 s `watch --once` used to wait, within the 45 s a stream waits for an agent's first word


@pytest.mark.slow
def test_watch_once_waits_for_an_agent_slow_to_start_as_long_as_its_stream_does(tmp_path, capsys):
    # on a loaded machine the agent's Python may take half a minute to say anything: `--once` must not call the
    # target unreachable ("not connected") while the target's own stream still waits for it
    python = tmp_path / "slow-python"
    python.write_text(f'#!/bin/sh\n[ "$2" = watch ] && sleep {SLOW_START_S}\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  local:\n    transport: local\n"
                    f"    workdir: {json.dumps(str(tmp_path / 'work'))}\n    python: {json.dumps(str(python))}\n")
    started = time.monotonic()
    code, snapshot, err = run_cli(str(path), "watch", "local", "--once", "--json", capsys=capsys)
    assert code == 0 and snapshot["errors"] == {}, err
    assert time.monotonic() - started > SLOW_START_S  # the agent did take that long
