"""The zipapp (deterministic, stdlib only, Python 3.8 syntax) and the CLI's JSON contract on bad input."""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from orchestrator.runs.bundle import ARCHIVE_PACKAGE, RECORDS_PACKAGE, build_zipapp, bundle_digest
from tests.dflash_agent.pidns import wait_state


def _modules() -> dict:
    data = build_zipapp()
    archive = zipfile.ZipFile(io.BytesIO(data))
    return {name: archive.read(name).decode() for name in archive.namelist()}


def test_zipapp_bytes_and_digest_are_stable():
    first, second = build_zipapp(), build_zipapp()
    assert first == second
    assert bundle_digest(first) == hashlib.sha256(first).hexdigest()[:16]
    assert bundle_digest(first + b"\n") != bundle_digest(first)
    names = zipfile.ZipFile(io.BytesIO(first)).namelist()
    assert names[0] == "__main__.py" and "{}/cli.py".format(ARCHIVE_PACKAGE) in names
    assert "{}/step.py".format(RECORDS_PACKAGE) in names  # what the agent shares with the trainer and controller
    assert "{}/bundle.py".format(ARCHIVE_PACKAGE) not in names  # the packer is controller code (orchestrator/runs/)
    assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in zipfile.ZipFile(io.BytesIO(first)).infolist())


def test_agent_modules_parse_as_python_38_and_import_only_the_stdlib():
    stdlib = getattr(sys, "stdlib_module_names", None)
    for name, source in _modules().items():
        tree = ast.parse(source, filename=name, feature_version=(3, 8))
        if stdlib is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [node.module.split(".")[0]]
            else:
                continue
            assert all(top in stdlib or top in ("__future__", ARCHIVE_PACKAGE, RECORDS_PACKAGE) for top in tops), (name, tops)


def _agent(pyz: str, *args: str) -> tuple:
    done = subprocess.run([sys.executable, pyz] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=30)
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, done.stdout
    return done.returncode, json.loads(lines[0]), done.stderr.decode()


@pytest.mark.parametrize("args, code", [
    ((), "bad_usage"),
    (("frobnicate",), "bad_usage"),
    (("ps",), "bad_usage"),
    (("kill", "--runs-dir", "/tmp/none", "--run-id", "a", "--grace", "soon"), "bad_usage"),
    (("kill", "--runs-dir", "/tmp/none", "--run-id", "a", "--grace", "-1"), "bad_usage"),
    (("launch", "--runs-dir", "/tmp/none", "--run-id", "a", "--name", "a", "--target", "t"), "no_command"),
    (("launch", "--runs-dir", "/tmp/none", "--run-id", "a", "--name", "a", "--target", "t", "--"), "no_command"),
])
def test_bad_usage_is_one_json_object_and_exit_2(agent_pyz, args, code):
    status, out, _ = _agent(agent_pyz, *args)
    assert (status, out["version"], out["ok"], out["code"]) == (2, 1, False, code)
    assert out["error"]


def test_help_goes_to_stderr_and_stdout_keeps_its_json(agent_pyz):
    status, out, err = _agent(agent_pyz, "launch", "--help")
    assert status == 0 and out["ok"] is True and "--runs-dir" in err


def test_version(agent_pyz):
    status, out, _ = _agent(agent_pyz, "version")
    assert status == 0 and out["version"] == 1 and out["python"] == sys.version.split()[0]


def _old_python() -> str | None:
    for candidate in ("python3.8", "python3.9"):
        path = shutil.which(candidate)
        if path and subprocess.run([path, "-c", "pass"], stderr=subprocess.DEVNULL).returncode == 0:
            return path
    return None


def test_a_whole_run_works_under_python_38(container, runs_dir):
    python = _old_python()
    if python is None:
        pytest.skip("no working python3.8/python3.9 on PATH")
    status, out = container.agent("version", python=python)
    assert status == 0 and out["python"].startswith("3.")
    status, out = container.agent("launch", "--runs-dir", runs_dir, "--run-id", "old", "--name", "o", "--target",
                                  "t", "--cwd", "/", "--settle", "0.2", "--", "sleep", "60", python=python)
    assert status == 0, out
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "old", "--grace", "1", python=python)
    assert status == 0 and out["runs"][0]["state"] == "killed"
    status, out = container.agent("launch", "--runs-dir", runs_dir, "--run-id", "old2", "--name", "o", "--target",
                                  "t", "--cwd", "/", "--settle", "0.2", "--", "sh", "-c", "sleep 0.5; exit 5",
                                  python=python)
    assert status == 0, out
    assert wait_state(container, runs_dir, "old2", ("failed",))["exit_code"] == 5
    with open(os.path.join(runs_dir, ".keeper", "keeper.json")) as handle:
        keeper_pid = json.load(handle)["pid"]
    assert container.run(["cat", "/proc/{}/cmdline".format(keeper_pid)]).stdout.startswith(python.encode())
