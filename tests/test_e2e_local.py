"""bench/e2e_local.py, the GPU machine's end-to-end check, run here on the CPU: launch, watch, kill."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.workloads import stop_keeper

pytest.importorskip("torch")
pytest.importorskip("datasets")
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path):
    """The local target's workdir under tmp_path; its keeper is stopped afterwards."""
    yield {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data-home"), "HF_HUB_OFFLINE": "1"}
    stop_keeper(tmp_path / "data-home" / "dflashctl" / ".dflash" / "runs")


@pytest.mark.slow
def test_launch_watch_kill_end_to_end_on_the_cpu(tmp_path, env):
    done = subprocess.run([sys.executable, "bench/e2e_local.py", "--shape", "tiny", "--device", "cpu",
                           "--workdir", str(tmp_path / "e2e"), "--steps-seen", "4", "--grace", "5"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["passed"] and all(report["checks"].values())
    assert len(report["skipped"]) == 2 and not set(report["skipped"]) & set(report["checks"])  # no GPU here
    assert report["watch"]["last_step"] >= 4 and report["watch"]["loss"] is not None
    assert report["kill"]["runs"][0]["state"] == "killed" and report["processes_left"] == []
    # the run lived in the local target's workdir under XDG_DATA_HOME, and ended there as killed
    states = list((tmp_path / "data-home").glob("dflashctl/.dflash/runs/*/state.json"))
    assert [json.loads(p.read_text())["state"] for p in states] == ["killed"]


@pytest.mark.slow
def test_a_terminated_check_still_kills_the_run_it_launched(tmp_path, env):
    """An outer timeout's TERM must not leave the detached run holding the machine."""
    import signal
    import time

    check = subprocess.Popen([sys.executable, "bench/e2e_local.py", "--shape", "tiny", "--device", "cpu",
                              "--workdir", str(tmp_path / "e2e"), "--steps-seen", "1000000", "--grace", "5"],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "data-home" / "dflashctl" / ".dflash" / "runs"
    deadline = time.monotonic() + 120
    while not list(runs.glob("*/state.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    states = list(runs.glob("*/state.json"))
    assert states, check.communicate(timeout=60)
    try:
        time.sleep(2)  # past launch: the script is watching
        check.send_signal(signal.SIGTERM)
        _, err = check.communicate(timeout=120)
        assert check.returncode == 143, err[-3000:]
        assert json.loads(states[0].read_text())["state"] == "killed"
    finally:  # never leave the run behind, whatever failed above
        if json.loads(states[0].read_text())["state"] in ("starting", "running"):
            subprocess.run([sys.executable, "-m", "orchestrator", "kill", states[0].parent.name, "--grace", "1"],
                           cwd=REPO_ROOT, env=env, capture_output=True, timeout=60)


def test_gpu_memory_is_read_per_gpu_and_compared_with_idle(tmp_path, monkeypatch):
    """The eight-GPU variant's checks, against the lab's nvidia-smi stand-in (the H200's real output format)."""
    import importlib.util

    from tests.lab.lab import install_fake_nvidia_smi

    bin_dir = install_fake_nvidia_smi(tmp_path)
    used = [0, 0, 35011, 0, 0, 0, 80, 0]
    (tmp_path / "gpus.json").write_text(json.dumps([{"index": i, "memory.used": m} for i, m in enumerate(used)]))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = importlib.util.spec_from_file_location("e2e_local", REPO_ROOT / "bench" / "e2e_local.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    readings = e2e.gpu_memory_mib(list(range(8)))
    assert readings == dict(enumerate(used))
    idle = dict.fromkeys(range(8), 0)
    assert e2e.above_idle(readings, idle) == {2: 35011, 6: 80}   # 80 MiB is past the 64 MiB tolerance
    assert e2e.above_idle(readings, {**idle, 2: 35000, 6: 40}) == {}
    assert e2e.gpu_memory_mib([1, 3]) == {1: 0, 3: 0}
