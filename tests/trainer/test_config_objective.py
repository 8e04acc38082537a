"""The training objective has one default, the config's: the loss code's Objective cannot drift from it, and a
config's `loss:` is parsed once, when the config is read."""
from __future__ import annotations

from unittest import mock

from trainer import config as config_module
from trainer import objectives as objectives_module
from trainer.config import TrainConfig
from trainer.training.losses import Objective


def default_config(**values) -> TrainConfig:
    return TrainConfig(target_path="target", data_path="data", output_dir="out", **values)


def test_objective_defaults_are_the_configs() -> None:
    assert Objective() == Objective.from_config(default_config())
    assert Objective().slot_weights == TrainConfig.model_fields["slot_weights"].default


def test_loss_is_parsed_once_when_the_config_is_read() -> None:
    cfg = default_config(loss={"ce": 0.1, "cap": 0.9})
    again = AssertionError("loss: parsed again")
    with mock.patch.object(config_module, "parse_loss", side_effect=again), \
            mock.patch.object(objectives_module, "parse_loss", side_effect=again):
        objective = Objective.from_config(cfg)
        assert cfg.needs_target_distribution() is False
        assert objective.describe() == "0.1*ce + 0.9*cap, dpace slot weights"
    assert objective.weights == {"ce": 0.1, "cap": 0.9}
