"""`launch --restart` on the `local` target: bad values, the inventory's default, `ps` showing the attempt, and
restarts that go on with the controller SIGKILLed right after the launch (the supervisor does them)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.lab.workloads import run_cli, write_local_inventory
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("value, words", [
    ("on-failure:-1", "'--restart': bad restart count in 'on-failure:-1'"),
    ("on-failure:x", "'--restart': bad restart count in 'on-failure:x'"),
    ("always", "'--restart': unknown restart policy 'always'"),
    ("on-failure:1001", "N is a whole number from 0 to 1000"),
])
def test_a_bad_restart_value_is_a_usage_error(value, words, tmp_path, capsys):
    """One line naming the value once, then the usage, as every other usage mistake."""
    inv = write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    assert main(["--inventory", inv, "launch", "local", "--restart", value, "--", "true"]) == 2
    captured = capsys.readouterr()
    first = captured.err.splitlines()[0]
    assert first.startswith("dflashctl: error: ") and words in first and first.count(value) == 1, captured.err
    assert "Usage: dflashctl launch" in captured.err and captured.out == ""
    assert not (tmp_path / "work" / ".dflash" / "runs").exists()  # refused before anything was contacted


# the backoff's base: at most its cap (1e308 crashed the supervisor, 400 waited 400 s), never negative or nan
@pytest.mark.parametrize("value, shown", [("1e308", "1e+308"), ("400", "400"), ("-1", "-1"), ("nan", "nan")])
def test_a_restart_backoff_out_of_range_is_a_usage_error(value, shown, tmp_path, capsys):
    inv = write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    assert main(["--inventory", inv, "launch", "local", "--restart", "on-failure", "--restart-backoff", value,
                 "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("dflashctl: error: Invalid value for '--restart-backoff': expected a number from "
                                   f"0 to 300, got {shown}") and "Traceback" not in err
    assert not (tmp_path / "work" / ".dflash" / "runs").exists()


def test_a_bad_inventory_restart_names_the_line(tmp_path, capsys):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  local:\n    transport: local\n    restart: on-failure:x\n")
    assert main(["--inventory", str(path), "ps"]) == 2
    err = capsys.readouterr().err
    assert "inventory.yaml:4" in err and "hosts.local.restart" in err and "bad restart count" in err


def flaky_script(tmp_path: Path, failures: int, gate: Path | None = None) -> list[str]:
    """Fails `failures` times, then succeeds; with `gate`, the succeeding attempt first waits (at most 60 s) for
    that file, so a test sees it running however slowly the machine polls."""
    script = tmp_path / "flaky.sh"
    wait = f"i=0; while [ ! -e {gate} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done" if gate else ":"
    script.write_text(textwrap.dedent(f"""\
        n=$(cat {tmp_path}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp_path}/count
        echo "[${{n}}s] step=$n loss=1.0"
        sleep 1
        [ $n -gt {failures} ] && {{ {wait}; exit 0; }}
        echo "ValueError: attempt $n"; exit 4
        """))
    return ["sh", str(script)]


def test_the_inventory_default_applies_and_ps_shows_the_attempt(tmp_path, inv_with_restart, capsys):
    gate = tmp_path / "second-attempt-seen"
    code, record, err = run_cli(inv_with_restart, "launch", "local", "--json", "--restart-backoff", "0.2", "--",
                                *flaky_script(tmp_path, failures=1, gate=gate), capsys=capsys)
    assert code == 0, err
    assert record["restart_policy"] == "on-failure:2" and record["max_attempts"] == 3

    def second_attempt():
        code, out, _ = run_cli(inv_with_restart, "ps", capsys=capsys)
        return out if "running (attempt 2/3)" in out else None
    assert wait_for(second_attempt, 30, interval=0.2)
    gate.touch()
    run_dir = Path(record["log_path"]).parent
    assert wait_for(lambda: json.loads((run_dir / "state.json").read_text())["state"] == "succeeded", 15)
    code, listing, _ = run_cli(inv_with_restart, "ps", "--all", "--json", capsys=capsys)
    run = next(r for r in listing["runs"] if r["run_id"] == record["run_id"])
    assert [a["exit_code"] for a in run["attempts"]] == [4, 0] and run["attempts"][0]["exception"] == "ValueError: attempt 1"


@pytest.fixture
def inv_with_restart(tmp_path):
    from tests.lab.workloads import stop_keeper
    path = tmp_path / "inventory.yaml"
    write_local_inventory(path, tmp_path / "work")
    path.write_text("defaults:\n  restart: on-failure:2\n" + path.read_text())
    yield str(path)
    stop_keeper(tmp_path / "work" / ".dflash" / "runs")


def test_restarts_go_on_with_the_controller_sigkilled_right_after_launch(tmp_path, inv_with_restart):
    runs = tmp_path / "work" / ".dflash" / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    controller = subprocess.Popen([sys.executable, "-m", "orchestrator", "--inventory", inv_with_restart, "launch",
                                   "local", "--restart", "on-failure:3", "--restart-backoff", "0.2", "--",
                                   *flaky_script(tmp_path, failures=2)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # the moment a supervisor holds the run, before the launch has verified anything
        claimed = wait_for(lambda: [p for p in runs.glob("*/state.json")
                                    if json.loads(p.read_text()).get("supervisor_pid")], 30, interval=0.02)
        assert claimed
        controller.send_signal(signal.SIGKILL)
    finally:
        controller.wait(timeout=30)
    assert controller.returncode == -signal.SIGKILL
    state_path = claimed[0]
    assert wait_for(lambda: json.loads(state_path.read_text())["state"] == "succeeded", 30, interval=0.1), \
        state_path.read_text()
    state = json.loads(state_path.read_text())
    assert [a["exit_code"] for a in state["attempts"]] == [4, 4, 0]
    assert (tmp_path / "count").read_text().strip() == "3"
