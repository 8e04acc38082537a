"""Run the bundled trainer's own pre-flight check on a target, before a run of it is started there.

`python -m trainer check` runs with the target's python, the deployed trainer first on PYTHONPATH (as the
supervisor puts it for the run), the run's --env, and relative paths taken from the directory the run will
work in. It imports no torch, so it costs one round trip and one Python start-up. A config it refuses fails
the launch with exit 2 and the trainer's one-line reasons; nothing is created on the target.
"""
from __future__ import annotations

import json

from .errors import OperationFailed, UsageError
from .inventory import Target
from .transports.base import Transport

CHECK_TIMEOUT_S = 60.0
# PYTHONPATH as the supervisor builds it: the deployed trainer first, then what the run inherits
WITH_TRAINER = 'PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"; export PYTHONPATH; shift; exec "$@"'


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


def check_argv(target: Target, *, pkg_dir: str, base_dir: str, source: str, env: dict[str, str]) -> list[str]:
    """The check's command line; the config comes on stdin. No shell sees any value: they are arguments."""
    return ["env", *(f"{key}={value}" for key, value in env.items()), "sh", "-c", WITH_TRAINER, "sh", pkg_dir,
            target.python, "-m", "trainer", "check", "--config", "-", "--json", "--base-dir", base_dir,
            "--source", source]


def check_trainer_config(transport: Transport, target: Target, config_text: bytes, *, pkg_dir: str,
                         base_dir: str, source: str, env: dict[str, str]) -> dict:
    """The check's report when the config passes; ConfigRejected (exit 2) with its reasons when it does not,
    OperationFailed when the check itself could not run there (e.g. the target's python lacks pydantic)."""
    argv = check_argv(target, pkg_dir=pkg_dir, base_dir=base_dir, source=source, env=env)
    result = transport.run(argv, stdin=config_text, timeout=CHECK_TIMEOUT_S)
    report = _report(result.out)
    if result.exit_code == 0 and report is not None and report.get("ok"):
        return report
    if result.exit_code == 2 and report is not None and report.get("problems"):
        raise ConfigRejected(target.name, source, [str(p.get("message")) for p in report["problems"]])
    raise OperationFailed(f"{target.name}: the trainer's config check could not run there, nothing was "
                          f"started: {result.describe()}")


def _report(stdout: str) -> dict | None:
    lines = stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
