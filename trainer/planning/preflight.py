"""Everything a training run needs, checked before any model loads, every problem in one pass (torch-free).

The order is the order a person fixes things in: the config's keys and values, then the paths it names (target,
data, output, resume) exist, then what is read from those paths (the target's config.json and its depth against
the taps, the dataset's files and columns), and last whether this python has what `train` imports. A check that needs a path which does not exist is skipped, so a
missing data path is named as such and never shows up as some knock-on problem.

Only json, yaml and pydantic are imported (no torch, no numpy, no pyarrow), so `python -m trainer check` costs
one Python start-up: `dflashctl launch` runs it on the target before it starts a run.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, Problem, TrainConfig, read_config_data, validate_config
from trainer.errors import TrainerError
from trainer.planning.dflash2 import Dflash2Sizes
from trainer.planning.taps import default_target_layer_ids, validate_layer_ids
from trainer.planning.target_families import LINEAR, read_target_spec

REQUIRED_COLUMNS = ("input_ids", "loss_mask")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
PREPARE_HINT = "make it with `python -m trainer prepare`"
# what `train` imports first; found without importing them (importing torch alone takes seconds)
TRAIN_MODULES = ("torch", "transformers", "datasets", "safetensors")


@dataclass
class Preflight:
    """What the checks found: the problems, and the facts read on the way (for the `check` command's report)."""

    source: str
    config: TrainConfig | None = None
    problems: list[Problem] = field(default_factory=list)
    target_layers: int | None = None
    layer_ids: list[int] | None = None
    data_files: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "source": self.source,
                "problems": [{"key": p.key, "message": p.message} for p in self.problems],
                "target_layers": self.target_layers, "target_layer_ids": self.layer_ids,
                "data_files": self.data_files}


def check_config_file(path: str | Path, *, text: str | bytes | None = None, base_dir: str | None = None,
                      overrides: dict[str, Any] | None = None, source: str | None = None) -> Preflight:
    """Check a config file (or `text`, its content) and the paths it names. Relative paths are taken from
    `base_dir` (default: the working directory), which need not exist yet: a run's directory is made at start."""
    source = source or str(path)
    try:
        data = read_config_data(path, text=text)
    except TrainerError as exc:
        return Preflight(source, problems=[Problem("config", str(exc).removeprefix(f"{path}: "))])
    report = validate_config({**data, **(overrides or {})})
    found = Preflight(source, config=report.config, problems=list(report.problems))
    resolve = _Resolver(base_dir)
    usable = [key for key in ("target_path", "data_path", "output_dir", "resume") if key not in report.unusable]
    present = {key for key in usable if _check_exists(key, report.config, resolve, found.problems)}
    if "target_path" in present:
        _check_target(report.config, report.unusable, resolve, found)
    if "data_path" in present:
        _check_dataset(resolve(report.config.data_path), found)
    problem = heldout_problem(report.config, resolve) if not {"eval_every", "heldout_path"} & report.unusable else None
    if problem is not None and ("data_path" in present or report.config.heldout_path):
        found.problems.append(problem)
    _check_modules(found.problems)
    if report.config.target_precision == "fp8" and not {"target_precision", "device"} & report.unusable:
        _check_fp8(report.config.device, found.problems)
    if "report_to" not in report.unusable:
        _check_reporters(report.config.report_to, found.problems)
    return found


HELDOUT_DIR = "heldout"  # where prepare writes the held-out split, inside the dataset directory


def heldout_dir(config: TrainConfig, resolve=Path) -> Path:
    """The held-out dataset: the config's heldout_path, else {data_path}/heldout."""
    return resolve(config.heldout_path) if config.heldout_path else resolve(config.data_path) / HELDOUT_DIR


def heldout_problem(config: TrainConfig, resolve=Path) -> Problem | None:
    """eval_every without a held-out split to evaluate on, with the fix."""
    path = heldout_dir(config, resolve)
    if not config.eval_every or path.is_dir():
        return None
    return Problem("eval_every", f"eval_every={config.eval_every} needs a held-out split and {path} does not "
                                 f"exist: run `python -m trainer prepare` with --heldout above 0 (default 0.01), "
                                 f"or set heldout_path")


def _check_modules(problems: list[Problem]) -> None:
    missing = [name for name in TRAIN_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        problems.append(Problem("python", f"python: {sys.executable} has no {', '.join(missing)}: install the "
                                          f"trainer's dependencies there (pip install 'dflashctl[train]')"))


def _check_fp8(device: str, problems: list[Problem]) -> None:
    """fp8 on the CPU or on a GPU without FP8 is refused before anything loads (planning/precision.py)."""
    from trainer.planning.precision import fp8_refusal, local_gpu

    if importlib.util.find_spec("torch") is None:   # _check_modules says so already
        return
    refusal = fp8_refusal(local_gpu(device))
    if refusal is not None:
        problems.append(Problem("target_precision", refusal))


def _check_reporters(report_to: list[str], problems: list[Problem]) -> None:
    """Each tracker of report_to needs its package (an optional extra): refused before anything loads."""
    for name in report_to:
        if importlib.util.find_spec(name) is None:
            install = "pip install 'dflashctl[report]'" if name == "tensorboard" else f"pip install {name}"
            problems.append(Problem("report_to", f"report_to: {name} needs the {name} package, which "
                                                 f"{sys.executable} does not have: {install}"))


def checked_config(path: str | Path, *, overrides: dict[str, Any] | None = None,
                   base_dir: str | None = None) -> TrainConfig:
    """The config with its tap ids resolved, once every check passed, and its relative paths taken from
    `base_dir` (default: the working directory); a ConfigError with all problems else."""
    found = check_config_file(path, overrides=overrides, base_dir=base_dir)
    if not found.ok:
        raise ConfigError(found.source, found.problems)
    found.config.target_layer_ids = found.layer_ids
    return with_base_dir(found.config, base_dir)


PATH_KEYS = ("target_path", "data_path", "output_dir", "heldout_path", "resume")  # the config's paths


def with_base_dir(config: TrainConfig, base_dir: str | None) -> TrainConfig:
    """The config with each relative path made absolute from `base_dir` (`train --base-dir`, which `launch`
    gives: a launched run works in its own run directory, where no data is)."""
    if base_dir:
        resolve = _Resolver(base_dir)
        for key in PATH_KEYS:
            value = getattr(config, key)
            if value and not (key == "resume" and value in ("auto", "never")):
                setattr(config, key, str(resolve(value)))
    return config


def resolve_config_path(base_dir: str, value: str) -> str:
    """A config path as the trainer takes it from `base_dir` (absolute ones as they are, `~` this user's home);
    `dflashctl doctor` places the paths it looks at by this rule too."""
    return os.path.normpath(os.path.join(os.path.abspath(base_dir), os.path.expanduser(value)))


class _Resolver:
    """Relative config paths, taken from the base directory (the run's, which may not exist yet)."""

    def __init__(self, base_dir: str | None) -> None:
        self.base = os.path.abspath(base_dir) if base_dir else None

    def __call__(self, value: str) -> Path:
        if self.base is None:
            return Path(value)
        return Path(resolve_config_path(self.base, value))

    def to_be_made(self, path: Path) -> bool:
        """True for the base directory itself and anything under it: it is created when the run starts."""
        return self.base is not None and (str(path) + os.sep).startswith(self.base + os.sep)


def _shown(value: str, path: Path) -> str:
    return value if str(path) == value else f"{value!r} (= {path})"


def _check_exists(key: str, config: TrainConfig, resolve: _Resolver, problems: list[Problem]) -> bool:
    """The path of `key` exists as a directory (output_dir: can be made); adds the problem and says False else."""
    value = getattr(config, key)
    if key == "resume" and value in ("auto", "never"):
        return False
    path = resolve(value)
    if key == "output_dir":
        return _check_output_dir(value, path, resolve, problems)
    what = {"target_path": "target directory", "data_path": "dataset directory",
            "resume": "checkpoint directory"}[key]
    if not path.exists():
        hint = f"; {PREPARE_HINT}" if key == "data_path" else ""
        problems.append(Problem(key, f"{key}: {what} {_shown(value, path)} does not exist{hint}"))
        return False
    if not path.is_dir():
        problems.append(Problem(key, f"{key}: {_shown(value, path)} is not a directory"))
        return False
    return True


def _check_output_dir(value: str, path: Path, resolve: _Resolver, problems: list[Problem]) -> bool:
    """output_dir is made with its parents at start: the nearest directory of it (or above it) that exists
    must be writable; under the run's own directory everything is made at start."""
    nearest = path
    while not nearest.exists():
        if resolve.to_be_made(nearest):
            return True
        nearest = nearest.parent
    if nearest == path and not path.is_dir():
        reason = "it is not a directory"
    elif not nearest.is_dir():
        reason = f"{nearest} is not a directory"
    elif not os.access(nearest, os.W_OK | os.X_OK):
        reason = f"{nearest} is not writable"
    else:
        return True
    problems.append(Problem("output_dir", f"output_dir: cannot write to {_shown(value, path)}: {reason}"))
    return False


def _check_target(config: TrainConfig, unusable: frozenset[str], resolve: _Resolver, found: Preflight) -> None:
    path = resolve(config.target_path)
    num_layers = _target_depth(path, found.problems)
    if num_layers is None:
        return
    found.target_layers = num_layers
    if not any((path / name).exists() for name in WEIGHT_FILES):
        found.problems.append(Problem("target_path", f"target_path: {path} has a config.json but no model weights "
                                                     f"({', '.join(WEIGHT_FILES)})"))
    if config.compile_target is True and LINEAR in read_target_spec(path).layer_types:
        found.problems.append(Problem("compile_target", "compile_target: a hybrid target's Gated DeltaNet layers "
                                                        "run flash-linear-attention's kernels, which are not "
                                                        "compiled with the layers; use compile_target: auto or false"))
    if config.architecture == "dflash2" and not unusable & {"conv_group_size", "selector_top_k"}:
        spec = read_target_spec(path)
        vocab = int(spec.text.get("vocab_size") or 0)
        found.problems += [Problem(key, message) for key, message in Dflash2Sizes.from_mapping(config).problems(
            hidden_size=spec.hidden_size, vocab_size=vocab)]
    if {"target_layer_ids", "drafter_layers"} & unusable or config.target_layer_ids == []:
        return  # already reported: the taps cannot be resolved
    try:
        if config.target_layer_ids is None:
            found.layer_ids = default_target_layer_ids(num_layers, config.drafter_layers)
        else:
            found.layer_ids = validate_layer_ids(config.target_layer_ids, num_layers)
    except TrainerError as exc:
        if config.target_layer_ids is None:
            found.problems.append(Problem("drafter_layers", f"drafter_layers: {exc} (drafter_layers "
                                                            f"{config.drafter_layers} sets the number of taps: "
                                                            f"lower it, or give target_layer_ids)"))
        else:
            found.problems.append(Problem("target_layer_ids", str(exc)))


def _target_depth(path: Path, problems: list[Problem]) -> int | None:
    """The depth of a supported target's text model, read from its config.json as JSON (target_families.py)."""
    if not (path / "config.json").is_file():
        problems.append(Problem("target_path", f"target_path: {path} is not a Hugging Face model directory "
                                               f"(no config.json)"))
        return None
    try:
        return read_target_spec(path).num_layers
    except TrainerError as exc:
        problems.append(Problem("target_path", f"target_path: {exc}"))
        return None


def _check_dataset(path: Path, found: Preflight) -> None:
    """A `prepare`d dataset as datasets.save_to_disk writes it: state.json names the Arrow files,
    dataset_info.json the columns. Reading both as JSON is enough to know the trainer can open it."""
    def problem(message: str) -> None:
        found.problems.append(Problem("data_path", f"data_path: dataset {path} {message}"))

    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        return problem(f"has several splits ({', '.join(splits)}); give one split's directory")
    try:
        state = json.loads((path / "state.json").read_text())
        files = [entry["filename"] for entry in state["_data_files"]]
        info = json.loads((path / "dataset_info.json").read_text())
        columns = list(info.get("features") or {})
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return problem(f"is not a saved Arrow dataset (no readable state.json and dataset_info.json); "
                       f"{PREPARE_HINT}")
    if not files:
        return problem("is empty")
    missing_files = [name for name in files if not (path / str(name)).is_file()]
    if missing_files:
        return problem(f"is incomplete: {', '.join(map(str, missing_files))} missing")
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        return problem(f"lacks the column(s) {', '.join(missing)} (has: {', '.join(columns) or 'none'}); "
                       f"{PREPARE_HINT}")
    found.data_files = len(files)
