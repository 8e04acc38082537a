"""The trainer's stack dump on SIGUSR1: what the supervisor's hang watchdog sends before it ends a hung run."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.trainer.conftest import REPO_ROOT

STUCK = """
import sys, time
from trainer.__main__ import main
import trainer.__main__ as entry
def waiting_for_a_collective(args):
    print("started", flush=True)
    time.sleep(30)
    return 0
entry._train = waiting_for_a_collective
sys.exit(main(["train", "--config", "unused.yaml"]))
"""


def test_sigusr1_writes_every_stack_to_stderr_and_the_trainer_goes_on(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", STUCK], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert proc.poll() is None  # a stack dump, not an end
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "most recent call first" in err and "waiting_for_a_collective" in err


def test_workers_torchrun_restarted_resume_from_the_newest_checkpoint():
    from trainer.training.startup import restarted_resume

    assert restarted_resume({"TORCHELASTIC_RESTART_COUNT": "1"}) == "auto"
    assert restarted_resume({"TORCHELASTIC_RESTART_COUNT": "0"}) is None and restarted_resume({}) is None
    assert restarted_resume({"TORCHELASTIC_RESTART_COUNT": "\u00b2"}) is None
