"""What reaches the user when sshd resets the connection during the banner: dflashctl's one line, nothing of
paramiko's (its transport thread logs the failure with a traceback, which Python's last-resort handler printed),
once the reset has been tried again until the connect timeout passed (sshd resets at random past MaxStartups)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.resetting_server import SSH_BANNER_START, inventory_text, resetting_server

REPO = Path(__file__).resolve().parents[3]


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


def test_a_host_that_keeps_resetting_is_tried_again_until_the_connect_timeout(tmp_path):
    with resetting_server() as port:
        (tmp_path / "inventory.yaml").write_text(inventory_text(port))  # connect_timeout: 2
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "orchestrator", "ps", "h"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert "closed the connection before the key exchange ended" in done.stderr and "MaxStartups" in done.stderr
    tries = re.search(r", (\d+) time\(s\) in ([\d.]+)s", done.stderr)
    assert tries and int(tries[1]) >= 3 and 2 <= float(tries[2]) < 2 + 5, done.stderr  # up to the timeout
    assert elapsed < 2 + 10  # and the process's own start; not stuck retrying
