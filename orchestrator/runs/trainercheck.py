"""The bundled trainer's own pre-flight check of a config, as a launch runs it on the target first.

The agent runs `python -m trainer check` (its command line: command.check_command) with the target's python
in the environment the run would get (the deployed trainer first on PYTHONPATH, the run's --env), relative
paths taken from the directory the run will work in, right before it would create the run: in the same round
trip as the launch. It imports no torch, so it costs one Python start-up. A config it refuses fails the launch
with exit 2 and the trainer's one-line reasons; nothing is created on the target. A multi-node job has every node checked before any starts.
"""
from __future__ import annotations

import json

from ..errors import OperationFailed, UsageError
from ..inventory.model import Target


class ConfigRejected(UsageError):
    """The trainer's check found problems in the config (or the paths and data it names) on a target."""

    def __init__(self, target: str, source: str, problems: list[str]) -> None:
        self.target, self.problems = target, list(problems)
        where = f"{target}: {source}"
        if len(problems) == 1:
            message = f"{where}: {problems[0]} (nothing was started)"
        else:
            message = (f"{where}: {len(problems)} problems, nothing was started:\n"
                       + "\n".join(f"  {problem}" for problem in problems))
        super().__init__(message)


def judge(target: Target, source: str, check: dict) -> dict:
    """The check's report when the config passes; ConfigRejected (exit 2) with its reasons when it does not,
    OperationFailed when the check itself could not run there (e.g. the target's python lacks pydantic)."""
    exit_code, report = check.get("exit_code"), _report(str(check.get("stdout") or ""))
    if exit_code == 0 and report is not None and report.get("ok"):
        return report
    if exit_code == 2 and report is not None and report.get("problems"):
        raise ConfigRejected(target.name, source, [str(p.get("message")) for p in report["problems"]])
    tail = (str(check.get("stderr") or "").strip() or str(check.get("stdout") or "").strip()).splitlines()[-1:]
    raise OperationFailed(f"{target.name}: the trainer's config check could not run there, nothing was "
                          f"started: `{target.python} -m trainer check` exited {exit_code}"
                          + (f": {tail[0]}" if tail else ""))


def _report(stdout: str) -> dict | None:
    lines = stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
