"""An unreachable host in `watch --once` and in the dashboard's host line: its name once, then the reason."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from orchestrator.cli import main as run_cli
from orchestrator.inventory.model import load_inventory
from orchestrator.watch.source import LiveSource
from orchestrator.watch.stream import reason_only


def closed_port() -> int:
    """A local port nothing listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def inventory_path(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  dead:\n    address: 127.0.0.1\n    port: {closed_port()}\n")
    return path


def test_watch_once_names_the_unreachable_host_once(inventory_path, capsys) -> None:
    code = run_cli(["--inventory", str(inventory_path), "watch", "dead", "--once", "--timeout", "10"])
    err = capsys.readouterr().err
    assert code == 3
    line = next(line for line in err.splitlines() if line.startswith("dead:"))
    assert line.startswith("dead: cannot connect to 127.0.0.1:"), line
    assert "dead: dead:" not in err


def test_watch_once_never_says_no_runs_for_a_target_it_could_not_read(inventory_path, tmp_path, capsys) -> None:
    # an unreachable target may have live runs: an empty table says which targets it speaks for
    code = run_cli(["--inventory", str(inventory_path), "watch", "dead", "--once", "--timeout", "10"])
    out = capsys.readouterr().out
    assert code == 3 and "no runs" not in out and out.strip() == "runs not read: unreachable: dead", out
    with inventory_path.open("a") as inventory:  # beside a target that answers with no runs
        inventory.write(f"  local:\n    transport: local\n    workdir: {json.dumps(str(tmp_path / 'work'))}\n"
                        f"    python: {json.dumps(sys.executable)}\n")
    code = run_cli(["--inventory", str(inventory_path), "watch", "--once", "--timeout", "30"])
    out = capsys.readouterr().out
    assert code == 3, out
    assert out.splitlines()[0] == "no runs on the targets that answered; not read (unreachable): dead", out


def test_the_dashboards_host_error_is_the_reason_alone(inventory_path) -> None:
    inventory = load_inventory(inventory_path)
    with LiveSource(inventory, inventory.targets(["dead"])) as source:
        assert source.wait_until_answered(10)
        host = source.snapshot().hosts[0]
        assert host.name == "dead" and not host.connected
        assert host.error.startswith("cannot connect to 127.0.0.1:"), host.error
        assert source.unreachable()["dead"] == host.error


def test_reason_only_strips_the_target_and_host_prefixes_and_nothing_else() -> None:
    assert reason_only("pve1: no answer", "pve1/200", "pve1") == "no answer"
    assert reason_only("pve1/200: no word from the watch agent", "pve1/200", "pve1") == \
        "no word from the watch agent"
    assert reason_only("the watch agent ended (exit code 1)", "pve1/200", "pve1") == \
        "the watch agent ended (exit code 1)"
    assert reason_only("pve10: refused", "pve1") == "pve10: refused"


def test_silence_tolerance_grows_with_the_gaps_a_stream_survived() -> None:
    from orchestrator.watch.stream import SILENCE_CAP_S, StreamOptions, silence_limit

    options = StreamOptions(heartbeat_s=1.0)
    assert silence_limit(options, 0.0) == options.silence_limit_s == 4.0
    assert silence_limit(options, 5.0) == 15.0  # heartbeats came 5 s apart under load: that was no outage
    assert silence_limit(options, 1000.0) == SILENCE_CAP_S
