"""Transports and doctor against the lab: real sshd in network namespaces, the pct stand-in, fake nvidia-smi."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import AuthError, HostKeyError, Unreachable
from orchestrator.inventory.model import load_inventory
from orchestrator.transports.pool import Connections
from tests.lab.sshd import known_hosts_line
from tests.resetting_server import resetting_server

pytestmark = pytest.mark.lab

HOSTILE = ["a b", "it's", '"dq"', "$(touch /tmp/dflash-pwned)", "; touch /tmp/dflash-pwned2;", "`id`",
           "new\nline", "", "-n", "*", "\\", "'; rm -rf /tmp/x; '"]
ECHO_ARGS = "import json,sys; print(json.dumps(sys.argv[1:])); sys.stderr.write('to-stderr'); sys.exit(5)"


@pytest.fixture(scope="module")
def inventory_path(lab, tmp_path_factory) -> Path:
    return lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml")


@pytest.fixture()
def conns():
    with Connections() as c:
        yield c


def test_argv_and_streams_survive_ssh_and_pct(lab, inventory_path: Path, conns: Connections) -> None:
    inv = load_inventory(inventory_path)
    target = inv.target("pve1/200")
    for transport in (conns.for_target(target), conns.host_transport(target.host)):
        result = transport.run([target.python, "-c", ECHO_ARGS, *HOSTILE])
        assert json.loads(result.out) == HOSTILE, transport.label
        assert (result.err, result.exit_code) == ("to-stderr", 5)
    for pwned in ("/tmp/dflash-pwned", "/tmp/dflash-pwned2"):
        assert not Path(pwned).exists()
        assert lab.ct_run("pve1", 200, ["test", "-e", pwned]).returncode != 0


def test_commands_run_inside_the_container(lab, inventory_path: Path, conns: Connections) -> None:
    inv = load_inventory(inventory_path)
    ct = conns.for_target(inv.target("pve1/200"))
    assert ct.run(["hostname"]).out.strip() == "ct200"
    ct.write_file("/workspace/probe.bin", b"\x00\xffdata")
    seen = lab.ct_run("pve1", 200, ["cat", "/workspace/probe.bin"])
    assert seen.stdout == b"\x00\xffdata"
    # another container of the same host does not see it
    other = conns.for_target(inv.target("pve2/300"))
    assert other.run(["test", "-e", "/workspace/probe.bin"]).exit_code == 1


def test_one_connection_per_host_is_reused(inventory_path: Path, conns: Connections) -> None:
    inv = load_inventory(inventory_path)
    first = conns.host_transport(inv.host("pve1"))
    first.run(["true"])
    transport = first.conn.transport()
    for _ in range(5):
        conns.for_target(inv.target("pve1/200")).run(["true"])
    assert conns.host_transport(inv.host("pve1")).conn.transport() is transport


def test_unknown_host_key_is_refused_with_instructions(lab, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    path = lab.write_inventory(tmp_path / "inv.yaml")
    text = path.read_text().replace(str(lab.known_hosts), str(empty))
    path.write_text(text)
    inv = load_inventory(path)
    with Connections() as conns, pytest.raises(HostKeyError) as info:
        conns.connect(inv.host("pve1"))
    assert "unknown host key" in str(info.value) and "ssh-keyscan" in str(info.value)
    assert empty.read_text() == ""  # never silently added


def test_accept_new_records_the_key_once(lab, tmp_path: Path) -> None:
    recorded = tmp_path / "kh"
    path = lab.write_inventory(tmp_path / "inv.yaml")
    path.write_text(path.read_text().replace(str(lab.known_hosts), str(recorded)).replace(
        "defaults: {", "defaults: {host_key_policy: accept-new, "))
    inv = load_inventory(path)
    with Connections() as conns:
        assert conns.host_transport(inv.host("pve2")).run(["true"]).ok
    assert recorded.read_text().count("\n") == 1
    # and with the key now known, the strict policy accepts it
    path.write_text(path.read_text().replace("host_key_policy: accept-new, ", ""))
    with Connections() as conns:
        assert conns.host_transport(load_inventory(path).host("pve2")).run(["true"]).ok


def test_doctor_reports_every_container(lab, inventory_path: Path, capsys) -> None:
    code = main(["--inventory", str(inventory_path), "doctor", "--json"])
    report = json.loads(capsys.readouterr().out)["targets"]
    assert set(report) == {"pve1/200", "pve1/201", "pve2/300", "local"}
    ct200 = report["pve1/200"]
    assert ct200["ok"] and ct200["pct"] and ct200["container"] == "running" and ct200["python"]
    assert len(ct200["gpus"]) == 8 and ct200["gpus"][1]["memory_used_mib"] == 96779
    assert report["pve2/300"]["ok"] and report["pve2/300"]["gpus"][0]["name"] == "NVIDIA H200"
    assert not report["pve1/201"]["ok"] and report["pve1/201"]["container"] == "stopped"
    assert code == 1  # a stopped container is a failed check, not an unreachable host


def test_doctor_with_a_host_link_down(lab, inventory_path: Path, tmp_path: Path, capsys) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(inventory_path.read_text().replace("defaults: {", "defaults: {connect_timeout: 2, "))
    lab.link_down("pve2")
    try:
        started = time.monotonic()
        code = main(["--inventory", str(path), "doctor", "--json", "pve1/200", "pve2/300", "local"])
        elapsed = time.monotonic() - started
    finally:
        lab.link_up("pve2")
    report = json.loads(capsys.readouterr().out)["targets"]
    assert code == 3
    assert report["pve2/300"]["reachable"] is False and "within 2s" in report["pve2/300"]["error"]
    assert report["pve1/200"]["ok"] and report["local"]["ok"]
    assert elapsed < 2 + 5  # the connect timeout, not some TCP default


def test_connection_drop_is_unreachable_not_a_traceback(lab, inventory_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(inventory_path.read_text().replace("defaults: {", "defaults: {connect_timeout: 2, "))
    inv = load_inventory(path)
    with Connections() as conns:
        ct = conns.for_target(inv.target("pve2/300"))
        assert ct.run(["true"]).ok
        lab.link_down("pve2")
        try:
            with pytest.raises(Unreachable):
                ct.run(["sleep", "1"], timeout=3)
        finally:
            lab.link_up("pve2")


def test_ssh_config_alias_user_and_identity_are_honoured(lab, tmp_path: Path, monkeypatch) -> None:
    """An inventory that names only an ~/.ssh/config alias reaches the host with that config's settings."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    host = lab.hosts["pve1"]
    (home / ".ssh" / "config").write_text(
        f"Host pve-alias\n  HostName {host.address}\n  Port {host.port}\n"
        f"  IdentityFile {lab.client_key}\n  UserKnownHostsFile {lab.known_hosts}\n"
        f"Host pve-as-nobody\n  HostName {host.address}\n  User nobody\n  IdentityFile {lab.client_key}\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"hosts:\n  pve1:\n    address: pve-alias\n    pct: {host.pct_command}\n"
                         "    containers:\n      200: {gpus: 8}\n")
    inv = load_inventory(inventory)
    assert inv.host("pve1").user is None and inv.host("pve1").identity_file is None  # all from ~/.ssh/config
    with Connections() as conns:  # no User anywhere: the inventory defaults' root
        assert conns.for_target(inv.target("pve1/200")).run(["hostname"]).out.strip() == "ct200"
    inventory.write_text(inventory.read_text().replace("pve-alias", "pve-as-nobody"))
    with Connections() as conns, pytest.raises(AuthError, match="nobody@"):  # the config's User is used
        conns.connect(load_inventory(inventory).host("pve1"))


def _hinted_command(message: str, program: str) -> str:
    """The shell command between backticks in an error message that starts with `program`."""
    return next(part for part in message.split("`") if part.startswith(program))


def test_the_unknown_key_hint_is_a_command_that_works_on_a_path_with_spaces(lab, tmp_path: Path) -> None:
    known = tmp_path / "my keys" / "known hosts"
    known.parent.mkdir()
    known.write_text("")
    path = lab.write_inventory(tmp_path / "inv.yaml")
    path.write_text(path.read_text().replace(str(lab.known_hosts), str(known)))
    inv = load_inventory(path)
    with Connections() as conns, pytest.raises(HostKeyError) as info:
        conns.connect(inv.host("pve1"))
    command = _hinted_command(str(info.value), "ssh-keyscan")
    assert subprocess.run(["sh", "-c", command], capture_output=True, timeout=30).returncode == 0
    assert known.read_text().strip()  # the key landed in the inventory's file, not beside it
    with Connections() as conns:
        assert conns.host_transport(inv.host("pve1")).run(["true"]).ok


def test_the_changed_key_hint_edits_the_inventorys_known_hosts(lab, tmp_path: Path) -> None:
    host = lab.hosts["pve1"]
    entry = f"[{host.address}]:{host.port}" if host.port != 22 else host.address
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    key_type, key = (tmp_path / "other.pub").read_text().split()[:2]
    known = tmp_path / "known hosts"
    known.write_text(f"{entry} {key_type} {key}\n")  # another key than the host's
    path = lab.write_inventory(tmp_path / "inv.yaml")
    path.write_text(path.read_text().replace(str(lab.known_hosts), str(known)))
    with Connections() as conns, pytest.raises(HostKeyError) as info:
        conns.connect(load_inventory(path).host("pve1"))
    assert "does NOT match" in str(info.value)
    command = _hinted_command(str(info.value), "ssh-keygen")
    assert f"-f {shlex.quote(str(known))}" in command
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert entry not in known.read_text()


def test_arguments_that_are_not_utf8_reach_the_container_as_typed(lab, inventory_path: Path,
                                                                 conns: Connections) -> None:
    target = load_inventory(inventory_path).target("pve1/200")
    raw = "\udcff-\udce9"  # what Python makes of the bytes \xff and \xe9 in argv
    echo = "import os, sys; sys.stdout.buffer.write(os.fsencode(sys.argv[1]))"
    assert conns.for_target(target).run([target.python, "-c", echo, raw]).stdout == b"\xff-\xe9"


def test_an_agent_full_of_other_keys_is_named_when_sshd_hangs_up_during_authentication(lab, tmp_path: Path,
                                                                                         monkeypatch) -> None:
    """sshd ends the session after MaxAuthTries (6) refused keys; paramiko then meets a closed transport and says
    only "No existing session". With seven other keys in a real ssh-agent and the right one in ~/.ssh, the user
    is told what happened and what to set, as an authentication error (not "cannot connect")."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(lab.client_key, home / ".ssh" / "id_ed25519")
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {"SSH_AUTH_SOCK": str(socket_path), "PATH": "/usr/bin:/bin"}
        for n in range(7):
            key = tmp_path / f"other-{n}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        path = lab.write_inventory(tmp_path / "inv.yaml")
        path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                                if "identity_file:" not in line))
        host = load_inventory(path).host("pve1")
        assert host.identity_file is None
        with Connections() as conns, pytest.raises(AuthError) as raised:
            conns.connect(host)
        message = str(raised.value)
        assert "No existing session" not in message and "MaxAuthTries" in message and "identity_file" in message
        # and with the key named, only it is offered first: the same agent no longer matters
        path.write_text(lab.write_inventory(tmp_path / "inv2.yaml").read_text())
        with Connections() as conns:
            assert conns.for_target(load_inventory(path).target("pve1/200")).run(["hostname"]).out.strip() == "ct200"
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_a_connection_reset_during_the_banner_is_made_again(lab, tmp_path: Path) -> None:
    """sshd past its MaxStartups resets new connections at random: the next attempt gets in."""
    host = lab.hosts["pve1"]
    with resetting_server(resets=3, then_relay_to=(host.address, host.port)) as port:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(known_hosts_line("127.0.0.1", port, host.host_key_pub_path))
        path = tmp_path / "inventory.yaml"
        path.write_text(f"hosts:\n  pve1:\n    address: 127.0.0.1\n    port: {port}\n"
                        f"    identity_file: {lab.client_key}\n    known_hosts: {known_hosts}\n"
                        f"    pct: {host.pct_command}\n    containers:\n      200: {{}}\n")
        with Connections() as conns:
            assert conns.for_target(load_inventory(path).target("pve1/200")).run(["hostname"]).out.strip() == "ct200"
