"""launch --check and check: a workload's own check runs first, in the run's environment, and a failing one
leaves nothing behind."""
from __future__ import annotations

import base64
import json
import os
import subprocess

from tests.dflash_agent.pidns import AGENT_PYTHON

# the check sees its stdin, the run's --env, the PYTHONPATH the run would get and the GPUs; exits 2 if told to
CHECK = ('import os, sys; data = sys.stdin.read(); '
         'print(json.dumps([data, os.environ.get("X"), os.environ["PYTHONPATH"], '
         'os.environ.get("CUDA_VISIBLE_DEVICES")])); sys.exit(2 if "bad" in data else 0)')
CHECK_ARGV = [AGENT_PYTHON, "-c", "import json; " + CHECK]


def _launch(container, runs_dir, run_id: str, config: bytes, tmp_path) -> tuple[int, dict]:
    packed = json.dumps({"config.yaml": base64.b64encode(config).decode()}).encode()
    argv = [AGENT_PYTHON, container.pyz, "launch", "--runs-dir", runs_dir, "--run-id", run_id, "--name", "c",
            "--target", "t", "--settle", "0.2", "--input", "config.yaml", "--env", "X=from env",
            "--pythonpath", str(tmp_path), "--gpus", "1", "--check", json.dumps(CHECK_ARGV),
            "--check-input", "config.yaml", "--", "sleep", "30"]
    done = subprocess.run(container.prefix() + argv, input=packed, stdout=subprocess.PIPE, timeout=30)
    return done.returncode, json.loads(done.stdout)


def test_a_failing_check_creates_nothing_and_answers_its_output(container, runs_dir, tmp_path):
    status, out = _launch(container, runs_dir, "refused", b"bad: 1\n", tmp_path)
    assert status == 1 and out["code"] == "check_failed" and out["check"]["exit_code"] == 2
    seen = json.loads(out["check"]["stdout"])
    assert seen[:2] == ["bad: 1\n", "from env"] and seen[2].split(os.pathsep)[0] == str(tmp_path)
    assert seen[3] == "1"
    assert not os.path.exists(os.path.join(runs_dir, "refused"))


def test_a_passing_check_lets_the_run_start(container, runs_dir, tmp_path):
    status, out = _launch(container, runs_dir, "passed", b"good: 1\n", tmp_path)
    assert status == 0 and out["run"]["state"] == "running", out
    assert container.agent("kill", "--runs-dir", runs_dir, "--run-id", "passed", "--grace", "2")[0] == 0


def test_check_on_its_own_passes_stdin_and_creates_nothing(container, runs_dir, tmp_path):
    argv = [AGENT_PYTHON, container.pyz, "check", "--env", "X=alone", "--pythonpath", str(tmp_path), "--",
            *CHECK_ARGV]
    done = subprocess.run(container.prefix() + argv, input=b"bad", stdout=subprocess.PIPE, timeout=30)
    out = json.loads(done.stdout)
    assert done.returncode == 1 and out["code"] == "check_failed"
    assert json.loads(out["check"]["stdout"])[:2] == ["bad", "alone"]
    done = subprocess.run(container.prefix() + argv, input=b"fine", stdout=subprocess.PIPE, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["check"]["exit_code"] == 0
    assert not os.path.isdir(runs_dir) or os.listdir(runs_dir) == []


def test_a_check_that_is_not_a_json_list_is_bad_input(container, runs_dir):
    argv = [AGENT_PYTHON, container.pyz, "launch", "--runs-dir", runs_dir, "--run-id", "x", "--name", "x",
            "--target", "t", "--check", "python3 -m trainer check", "--", "true"]
    done = subprocess.run(container.prefix() + argv, stdout=subprocess.PIPE, timeout=30)
    assert done.returncode == 2 and json.loads(done.stdout)["code"] == "bad_check"
