"""The controller's one door to the bundled trainer's config: every read of it goes through here, and every
problem it finds is a UsageError (exit 2) or, where the check itself could not run, an OperationFailed.

Two reads, both torch-free (DESIGN.md): on this machine, the config file as the trainer reads it (its YAML
mapping, and the defaults of its keys) to plan a launch and doctor's checks; on the target, the trainer's own
pre-flight check, `python -m trainer check` (its command line: command.check_command), which the agent runs
with the target's python in the environment the run would get, right before it would create the run, in the
same round trip as the launch. A config the check refuses fails the launch with the trainer's one-line
reasons; nothing is created on the target. A multi-node job has every node checked before any starts.
"""
from __future__ import annotations

import json
from pathlib import Path

from dflash_records.answers import CheckResult

from ..errors import OperationFailed, UsageError
from ..inventory.model import Target

# The trainer is imported inside the functions: only the commands that read a config pay for loading its
# config model (pydantic), not every `ps` or `kill`.


def read_config(path: Path, text: bytes | None = None) -> dict:
    """The config's YAML mapping as the trainer reads it (`text`, when the file was read already); a file that
    cannot be read, is not YAML or is not a mapping is a UsageError naming it."""
    from trainer.config import read_config_data
    from trainer.errors import TrainerError

    try:
        return read_config_data(path, text=text)  # bytes: a file that is not UTF-8 is refused, not mangled
    except TrainerError as exc:
        raise UsageError(f"--config: {exc}") from None


def config_file(path: Path) -> tuple[bytes, dict]:
    """The config file's bytes (what a launch sends to the target) and its mapping; UsageErrors as read_config."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    return text, read_config(path, text)


def config_defaults() -> dict:
    """Each config key's default, as the trainer's config model declares it."""
    from trainer.config import TrainConfig

    return {name: field.default for name, field in TrainConfig.model_fields.items()}


def unknown_key(key: str) -> str | None:
    """Why `key` is not a key of the trainer's config (with the key it was probably meant to be, by the trainer's
    own rule), or None when it is one."""
    from trainer.config import TrainConfig, suggest_key

    if key in TrainConfig.model_fields:
        return None
    close = suggest_key(key)
    return f"unknown config key {key!r}" + (f" (did you mean {close!r}?)" if close else "")


def config_problems(data: dict) -> list[str]:
    """What the trainer's config model says of a mapping, one line a problem (its keys and values, not its
    paths or data: those the trainer's check on the target sees)."""
    from trainer.config import validate_config

    return [problem.message for problem in validate_config(data).problems]


def config_path(base_dir: str, value: str) -> str:
    """A config path where the trainer takes it from `base_dir` (command.config_base_dir), by its own rule."""
    from trainer.planning.preflight import resolve_config_path

    return resolve_config_path(base_dir, value)


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


def judge(target: Target, source: str, check: CheckResult) -> dict:
    """The check's report when the config passes; ConfigRejected (exit 2) with its reasons when it does not,
    OperationFailed when the check itself could not run there (e.g. the target's python lacks pydantic)."""
    exit_code, report = check.exit_code, _report(str(check.stdout or ""))
    if exit_code == 0 and report is not None and report.get("ok"):
        return report
    if exit_code == 2 and report is not None and report.get("problems"):
        raise ConfigRejected(target.name, source, [str(p.get("message")) for p in report["problems"]])
    tail = (str(check.stderr or "").strip() or str(check.stdout or "").strip()).splitlines()[-1:]
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
