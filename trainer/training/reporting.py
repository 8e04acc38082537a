"""Where else a run's numbers go, besides its step lines and metrics.jsonl: the experiment trackers users of
other trainers compare runs in (`report_to:` in the config). Rank 0 only, as the step lines.

Each tracker gets, under the run's name, every metric of every metrics.jsonl step record (loss, acc, lr, tok/s,
the τ figures, the phase times; not the record's version nor the world size) at its step, and the resolved config
once. TensorBoard writes
event files to {output_dir}/tensorboard; Weights & Biases runs offline (files under {output_dir}/wandb) unless
the user configured it (WANDB_MODE, WANDB_API_KEY, or a `wandb login`); MLflow logs to MLFLOW_TRACKING_URI,
else to {output_dir}/mlruns. Each is an optional package: a config that names a missing one is refused by the
config check, in one line, before anything loads (trainer/planning/preflight.py).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

PROJECT = "dflash"  # the W&B project and MLflow experiment runs land in unless the user's environment says
# numbers of a step record that are not measurements: its x axis, the record's schema version, the run's size
NOT_METRICS = frozenset({"step", "v", "world_size"})


class Reporter(Protocol):
    def step(self, step: int, numbers: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def run_name(output_dir: Path) -> str:
    """The launcher's run id (dflashctl sets DFLASH_RUN_ID), else the output directory's name."""
    return os.environ.get("DFLASH_RUN_ID") or Path(output_dir).resolve().name


def open_reporters(report_to: list[str], *, output_dir: Path, config: dict, config_text: str) -> list[Reporter]:
    opened: list[Reporter] = []
    name = run_name(output_dir)
    for kind in report_to:
        opened.append(_OPENERS[kind](output_dir=Path(output_dir), name=name, config=config,
                                     config_text=config_text))
    return opened


def numbers_of(record: dict) -> dict[str, float]:
    """The metrics of a metrics.jsonl step record: its numeric fields but those NOT_METRICS names, lists (queue
    depths, histograms) left out."""
    return {key: float(value) for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in NOT_METRICS}


class TensorBoard:
    def __init__(self, *, output_dir: Path, name: str, config: dict, config_text: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # one subdirectory per run name: `tensorboard --logdir OUTPUT/tensorboard` (or a parent of several
        # runs' output directories) shows them side by side
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard" / name))
        self.writer.add_text("config", "```yaml\n" + config_text + "\n```", global_step=0)

    def step(self, step: int, numbers: dict[str, float]) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(f"train/{key}", value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, *, output_dir: Path, name: str, config: dict, config_text: str) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_configured() else "offline")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, config=config,
                              dir=str(output_dir), mode=mode)

    def step(self, step: int, numbers: dict[str, float]) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_configured() -> bool:
    """An API key in the environment or from `wandb login` (~/.netrc): the user chose to send runs online."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text(errors="replace")
    except OSError:
        return False


class MLflow:
    def __init__(self, *, output_dir: Path, name: str, config: dict, config_text: str) -> None:
        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((output_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT))
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=name)
        mlflow.log_params({key: str(value)[:500] for key, value in config.items()})
        mlflow.log_text(config_text, "config.yaml")

    def step(self, step: int, numbers: dict[str, float]) -> None:
        self.mlflow.log_metrics(numbers, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


_OPENERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}
