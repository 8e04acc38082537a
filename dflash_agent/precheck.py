"""A workload's own check, run before its run is created: in the environment the run would get, with one of
the run's inputs on its stdin. For the bundled trainer this is `python -m trainer check`; a check that fails
leaves nothing behind (no run directory, no supervisor), and its output goes back to the controller as it is.
"""
from __future__ import annotations

import json
import os
import subprocess

from .errors import BadInput, OperationFailed

CHECK_TIMEOUT_S = 120.0
MAX_OUTPUT_CHARS = 64 * 1024


def parse_check_argv(text: str) -> list:
    """--check's value: a JSON list of strings (the command line of the check)."""
    try:
        argv = json.loads(text)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(part, str) and part for part in argv):
        raise BadInput("--check needs a JSON list of non-empty strings, got {!r}".format(text[:200]),
                       code="bad_check")
    return argv


def check_environment(env: dict, pythonpath: list, gpus: list | None) -> dict:
    """What the run's workload would see, as the supervisor builds it (without the run's own ids)."""
    merged = dict(os.environ)
    merged.update(env)
    inherited = [merged["PYTHONPATH"]] if merged.get("PYTHONPATH") else []
    if pythonpath:
        merged["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + inherited)
    if gpus is not None:
        merged["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return merged


def run_check(argv: list, *, env: dict, stdin: bytes) -> dict:
    """Run the check; its exit code and output when it exits 0, an OperationFailed (code check_failed)
    carrying the same as "check" when it does not."""
    try:
        done = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              cwd="/", timeout=CHECK_TIMEOUT_S)
        result = {"exit_code": done.returncode, "stdout": _text(done.stdout), "stderr": _text(done.stderr)}
    except OSError as exc:
        result = {"exit_code": 127, "stdout": "", "stderr": "cannot run {}: {}".format(argv[0], exc)}
    except subprocess.TimeoutExpired:
        result = {"exit_code": 124, "stdout": "", "stderr": "the check ran past {:g} s".format(CHECK_TIMEOUT_S)}
    if result["exit_code"] != 0:
        raise OperationFailed("the workload's check exited {}; nothing was created".format(result["exit_code"]),
                              code="check_failed", details={"check": result})
    return result


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")[-MAX_OUTPUT_CHARS:]
