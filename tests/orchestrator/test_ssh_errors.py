"""What reaches the user when sshd resets the connection during the banner: dflashctl's one line, nothing of
paramiko's (its transport thread logs the failure with a traceback, which Python's last-resort handler printed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.resetting_server import SSH_BANNER_START, inventory_text, resetting_server

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("first_bytes", [b"", SSH_BANNER_START], ids=["before-the-banner", "mid-banner"])
@pytest.mark.parametrize("args", [["ps", "h"], ["launch", "h", "--", "true"]], ids=["ps", "launch"])
def test_a_reset_during_the_banner_is_one_error_line_and_exit_3(tmp_path, first_bytes, args):
    with resetting_server(first_bytes) as port:
        (tmp_path / "inventory.yaml").write_text(inventory_text(port))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("launching ")]  # launch's progress
    assert len(lines) == 1 and lines[0].startswith("dflashctl: error: ") and "127.0.0.1" in lines[0], done.stderr
