"""The local transport and the parts every transport shares (argv fidelity, files, exit codes)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.errors import CommandTimeout
from orchestrator.transports.base import write_file_argv
from orchestrator.transports.local import LocalTransport
from orchestrator.transports.mock import MockTransport, answer
from orchestrator.transports.pct import PctTransport

HOSTILE = ["a b", "it's", '"dq"', "$(touch /tmp/dflash-pwned)", "; echo x", "`id`", "new\nline", "", "-n", "*"]
ECHO_ARGS = "import json,sys; print(json.dumps(sys.argv[1:])); sys.stderr.write('to-stderr'); sys.exit(5)"


def test_argv_stdout_stderr_exit_code_intact() -> None:
    result = LocalTransport().run([sys.executable, "-c", ECHO_ARGS, *HOSTILE])
    assert json.loads(result.out) == HOSTILE
    assert (result.err, result.exit_code) == ("to-stderr", 5)
    assert not Path("/tmp/dflash-pwned").exists()


def test_missing_command_is_127_and_signals_are_128_plus() -> None:
    t = LocalTransport()
    assert t.run(["no-such-command-dflash"]).exit_code == 127
    assert t.run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]).exit_code == 137


def test_timeout_raises() -> None:
    with pytest.raises(CommandTimeout):
        LocalTransport().run(["sleep", "5"], timeout=0.3)


def test_write_file_is_atomic_and_creates_dirs(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "f.bin"
    data = bytes(range(256)) * 1000
    LocalTransport().write_file(str(target), data, mode=0o600)
    assert target.read_bytes() == data
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


@pytest.mark.parametrize("arrived", [lambda d: d[:len(d) // 2], lambda d: d[:-1] + b"?"])
def test_write_file_installs_nothing_when_the_upload_is_cut_or_damaged(tmp_path: Path, arrived) -> None:
    # what a connection reset mid-upload delivers: stdin ends early (or one byte differs), the shell sees EOF
    target = tmp_path / "agent-0123.pyz"
    data = bytes(range(256)) * 200
    result = LocalTransport().run(write_file_argv(str(target), data, 0o644), stdin=arrived(data))
    assert result.exit_code == 3 and ("cut short" in result.err or "damaged" in result.err)
    assert list(tmp_path.iterdir()) == []  # neither the final name nor the temp file


def test_streaming_process_reads_as_output_comes() -> None:
    proc = LocalTransport().start([sys.executable, "-u", "-c", "import sys\nfor l in sys.stdin: print(l.upper(), end='')"])
    proc.write(b"hello\n")
    assert proc.read(timeout=5) == b"HELLO\n"
    proc.close_stdin()
    assert proc.read(timeout=5) == b""
    proc.close()
    assert proc.poll() == 0


def test_pct_wraps_argv_without_a_shell() -> None:
    host = MockTransport(lambda argv, stdin: answer("ok")(argv))
    ct = PctTransport(host, 200, pct_command="sudo /usr/sbin/pct")
    result = ct.run(["python3", "-c", "print(1)", "a b"], stdin=b"in")
    assert host.calls == [(("sudo", "/usr/sbin/pct", "exec", "200", "--", "python3", "-c", "print(1)", "a b"), b"in")]
    assert result.argv == ("python3", "-c", "print(1)", "a b") and result.out == "ok"
    assert ct.label == "mock/200"


def test_a_fanout_exits_with_the_worst_of_its_targets_codes(tmp_path: Path) -> None:
    """Every target is tried; an unreachable one (3) outranks a usage error (2), which outranks a failure (1)."""
    from orchestrator.errors import OperationFailed, TargetNotFound, Unreachable
    from orchestrator.inventory.model import parse_inventory
    from orchestrator.transports.fanout import fanout_exit_code, per_host

    text = "hosts:\n" + "".join(f"  h{i}:\n    address: 192.0.2.{i}\n" for i in range(4))
    targets = parse_inventory(text, tmp_path / "inventory.yaml").targets(["h0", "h1", "h2", "h3"])
    raised = {"h1": OperationFailed("no"), "h2": TargetNotFound("which?"), "h3": Unreachable("down")}

    def operation(target):
        if target.name in raised:
            raise raised[target.name]
        return {"ok": True}

    outcomes = per_host(targets, operation)
    assert [o.ok for o in outcomes] == [True, False, False, False]
    assert [fanout_exit_code(outcomes[:n]) for n in (1, 2, 3, 4)] == [0, 1, 2, 3]
    refused = per_host(targets[:1], lambda target: {"ok": False})
    assert fanout_exit_code(refused, lambda value: value["ok"]) == 1
