"""The tiny trainer config the lab tests launch, and the tiny target and dataset it names: one writer for every
lab test file."""
from __future__ import annotations

from pathlib import Path

import yaml


def output_dir(path: Path) -> str:
    """The config's output_dir, relative (so under the container's workdir, where launch takes it from), one per
    config file: no launch resumes from another test's checkpoints."""
    return f"out/{path.parent.name}-{path.stem}"


def write_config(path: Path, tiny: dict[str, Path], **overrides) -> Path:
    config = {"target_path": str(tiny["target"]), "data_path": str(tiny["dataset"]), "output_dir": output_dir(path),
              "max_steps": 6, "block_size": 8, "num_anchors": 16, "drafter_layers": 1, "token_budget": 2048,
              "buckets": [0, 128, 256, 512], "lr": 3e-3, "warmup_ratio": 0.1, "log_every": 1,
              "checkpoint_every": 3, "seed": 0, "device": "cpu", "num_workers": 1, "prefetch": 2, **overrides}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_tiny(root: Path) -> dict[str, Path]:
    """The tiny target and a small dataset in its format under `root`, where every lab container can read them."""
    from tests.trainer.data.test_dataset import write_dataset
    from trainer.model.tiny_target import write_tiny_target

    return {"target": write_tiny_target(root / "target", seed=0),
            "dataset": write_dataset(root / "dataset", [40, 60, 90] * 8)}
