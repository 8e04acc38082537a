"""bench/e2e_local.py, the GPU machine's end-to-end check, run here on the CPU: launch, watch, kill."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("datasets")
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_launch_watch_kill_end_to_end_on_the_cpu(tmp_path):
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data-home"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "bench/e2e_local.py", "--shape", "tiny", "--device", "cpu",
                           "--workdir", str(tmp_path / "e2e"), "--steps-seen", "4", "--grace", "5"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["passed"] and all(report["checks"].values())
    assert report["watch"]["last_step"] >= 4 and report["watch"]["loss"] is not None
    assert report["kill"]["runs"][0]["state"] == "killed" and report["processes_left"] == []
    # the run lived in the local target's workdir under XDG_DATA_HOME, and ended there as killed
    states = list((tmp_path / "data-home").glob("dflashctl/.dflash/runs/*/state.json"))
    assert [json.loads(p.read_text())["state"] for p in states] == ["killed"]
