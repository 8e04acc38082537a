"""A `pct exec` that hangs forever (a frozen container, a stuck lxc-attach), made by the pct stand-in's
exec-hangs knob: every command returns in its time, ends the `pct exec` it started on the host, and calls the
target unreachable (exit 3, one line naming it and the timeout), never "no run"; and the host ends it by the
command line's own bound when the controller cannot."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import CommandTimeout
from orchestrator.inventory.model import load_inventory
from orchestrator.transports import ssh
from orchestrator.transports.pool import Connections
from orchestrator.transports.timeouts import HOST_BOUND_MARGIN_S

from tests.lab.workloads import QUIET, quick_inventory
from tests.lab.workloads import run_cli as cli
from tests.polling import wait_for
from tests.trainer.conftest import REPO_ROOT

pytestmark = pytest.mark.lab
HOST, CTID = "pve2", 300
TARGET = f"{HOST}/{CTID}"


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    quick_inventory(lab, path)
    return str(path)


@pytest.fixture()
def live_run(inv: str, capsys):
    code, record, err = cli(inv, "launch", TARGET, "--json", "--name", "hung", "--", "python3", "-c", QUIET,
                            capsys=capsys)
    assert code == 0, err
    yield record
    cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


@pytest.fixture()
def hang(lab):
    """hang(arg): from now on `pct exec` on the target hangs (for commands with that argument; "" for all)."""
    knob = lab.hosts[HOST].containers[CTID].dir / "exec-hangs"

    def set_knob(only: str = "") -> None:
        knob.write_text(only + "\n")

    yield set_knob
    knob.unlink(missing_ok=True)


def pct_execs(lab) -> list[int]:
    """The host's `pct exec` processes of the target (this lab's stand-in only), by pid."""
    pct = lab.hosts[HOST].pct_command.encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if pct in argv[:2] and b"exec" in argv and str(CTID).encode() in argv:
            found.append(int(entry))
    return found


def assert_none_left(lab, timeout: float = 10) -> None:
    wait_for(lambda: not pct_execs(lab), timeout=timeout, what=lambda: f"hung pct exec left: {pct_execs(lab)}")


def test_a_command_that_times_out_is_ended_on_the_host(lab, inv: str, hang) -> None:
    hang()
    inventory = load_inventory(Path(inv))
    with Connections() as conns:
        transport = conns.for_target(inventory.target(TARGET))
        for _ in range(3):
            with pytest.raises(CommandTimeout) as caught:
                transport.run(["true"], timeout=1.5)
            assert caught.value.exit_code == 3
            assert str(caught.value).startswith(f"{TARGET}: ") and "1.5s" in str(caught.value)
            assert_none_left(lab)  # while the connection is still open: the timeout ended it
        with pytest.raises(CommandTimeout):  # one that never reads its input does not hang the sender
            transport.run(["cat"], stdin=b"x" * (8 << 20), timeout=1.5)
        assert_none_left(lab)


@pytest.mark.parametrize("command", [("logs",), ("kill", "--grace", "1")])
def test_logs_and_kill_of_a_run_on_a_hung_target_say_unreachable(lab, inv: str, live_run: dict, hang, command,
                                                                   monkeypatch, capsys) -> None:
    monkeypatch.setattr("orchestrator.runs.client.AGENT_TIMEOUT_S", 2.0)
    hang("ps")  # the agent's listing hangs: the run cannot be looked up
    code, out, err = cli(inv, command[0], live_run["run_id"], *command[1:], capsys=capsys)
    assert code == 3, (out, err)
    assert len(err.strip().splitlines()) == 1 and TARGET in err and "2s" in err, err
    assert "no run" not in err and "unreachable" in err, err
    assert_none_left(lab)


@pytest.mark.parametrize("hung", ["watch", ""])
def test_watch_once_on_a_hung_target_says_so_and_leaves_nothing(lab, inv: str, live_run: dict, hang, hung: str,
                                                                capsys) -> None:
    # "watch": the agent's stream never says a word; "": not even the deploy check before it returns, and the
    # command still running when watch --once gives up is ended as its connection closes
    hang(hung)
    code, out, err = cli(inv, "watch", TARGET, "--once", "--timeout", "3", capsys=capsys)
    assert code == 3, (out, err)
    assert "no runs" not in out, out
    assert TARGET in err and "3s" in err, err
    assert_none_left(lab)


CONTROLLER = """
import sys
from pathlib import Path
from orchestrator.inventory.model import load_inventory
from orchestrator.transports.pool import Connections
inventory = load_inventory(Path(sys.argv[1]))
with Connections() as conns:
    conns.for_target(inventory.target(sys.argv[2])).run(["true"], timeout=float(sys.argv[3]))
"""


def test_a_hung_command_is_ended_by_its_host_when_the_controller_cannot_end_it(lab, inv: str, hang) -> None:
    """The controller's own ending is a second round trip, which a controller killed (or one too loaded to get
    it through) never makes: the command line carries its bound, and the host ends the `pct exec` itself."""
    hang()
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, inv, TARGET, "2"], cwd=REPO_ROOT,
                                  stderr=subprocess.PIPE)
    try:
        wait_for(lambda: pct_execs(lab), timeout=30, what="the command never reached the host")
        controller.kill()  # before its timeout: nothing of the controller is left to end the command
    finally:
        controller.wait()
    assert pct_execs(lab)  # still hung on the host...
    assert_none_left(lab, timeout=2 + HOST_BOUND_MARGIN_S + 15)  # ...until the host's bound ends it


def test_a_result_that_comes_after_the_timeout_is_a_timeout(lab, inv: str, hang, monkeypatch) -> None:
    """A controller too loaded to notice its own timeout reads the host's bound ending the command (timeout's
    124, or a KILL): that is the timeout it is, not the command's exit code."""
    hang()
    monkeypatch.setattr("orchestrator.transports.remotegroup.HOST_BOUND_MARGIN_S", 0.0)
    real_drain = ssh.drain

    def starved(chan, *args):  # the thread gets no CPU until the host's bound has ended the command
        wait_for(lambda: chan.exit_status_ready(), timeout=20, what="the host's bound never ended the command")
        return real_drain(chan, *args)

    monkeypatch.setattr(ssh, "drain", starved)
    inventory = load_inventory(Path(inv))
    with Connections() as conns:
        with pytest.raises(CommandTimeout) as caught:
            conns.for_target(inventory.target(TARGET)).run(["true"], timeout=1)
    assert str(caught.value).startswith(f"{TARGET}: unresponsive: ") and "1s" in str(caught.value)
    assert_none_left(lab)


def test_a_host_with_a_container_that_answers_is_connected(lab, inv: str, capsys) -> None:
    """pve1/201 is stopped and cannot answer; pve1/200 answers: the host is connected, the stopped container is
    the one named unreachable."""
    code, snapshot, err = cli(inv, "watch", "pve1/200", "pve1/201", "--once", "--json", "--timeout", "20",
                              capsys=capsys)
    assert code == 3 and isinstance(snapshot, dict), (code, snapshot, err)
    assert list(snapshot["errors"]) == ["pve1/201"], snapshot["errors"]
    hosts = {host["name"]: host for host in snapshot["hosts"]}
    assert hosts["pve1"]["connected"] is True, hosts
    assert hosts["pve1"]["unreachable"] == ["pve1/201"], hosts
