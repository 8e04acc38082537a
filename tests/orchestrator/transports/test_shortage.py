"""dflashctl's own shortages: found wherever they sit in an error's chain, and the soft open-file limit raised at
start, at most to what select() can wait on."""
from __future__ import annotations

import errno
import resource
import subprocess
import sys

import paramiko

from orchestrator.transports.shortage import SELECT_FD_LIMIT, out_of_resources

from tests.trainer.conftest import REPO_ROOT


def test_a_shortage_is_found_in_the_chain_and_named_with_its_limit() -> None:
    emfile = OSError(errno.EMFILE, "Too many open files")
    try:
        try:
            raise emfile
        except OSError:
            raise paramiko.SSHException("Unable to open channel.")  # noqa: B904 - paramiko's way
    except paramiko.SSHException as wrapped:
        error = out_of_resources("pve1", wrapped, "while running pct")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert str(error) == (f"pve1: dflashctl ran out of file descriptors (ulimit -n {soft}) while running pct: "
                          "Unable to open channel.")
    assert error.exit_code == 3
    every_address = paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.1", 22): emfile})
    assert "file descriptors" in str(out_of_resources("pve1", every_address))
    assert out_of_resources("pve1", OSError(errno.ECONNRESET, "Connection reset by peer")) is None
    assert out_of_resources("pve1", EOFError()) is None


def test_the_soft_open_file_limit_is_raised_toward_the_hard_one_at_most_to_selects(tmp_path) -> None:
    probe = ("import resource; from orchestrator.transports.shortage import raise_open_file_limit; "
             "raise_open_file_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))")

    def limits_after(soft: int, hard: int) -> list[int]:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=REPO_ROOT, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                                   (soft, hard)))
        return [int(word) for word in done.stdout.split()]

    assert limits_after(24, 200) == [200, 200]
    assert limits_after(24, 4096) == [SELECT_FD_LIMIT, 4096]
    assert limits_after(2048, 4096) == [2048, 4096]  # never lowered
