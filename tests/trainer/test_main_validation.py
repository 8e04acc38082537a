"""Bad input is a clear error (exit 2, no traceback) found before any model is loaded."""
from __future__ import annotations

import shutil

import pytest

from tests.trainer.conftest import write_config
from tests.trainer.data.test_dataset import write_dataset
from trainer.__main__ import main


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Any attempt to load the target fails the test: validation must come first."""
    import trainer.model.target

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr(trainer.model.target.TargetModel, "load", classmethod(refuse))
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", refuse)


def _train(tmp_path, capsys, config: dict) -> tuple[int, str, str]:
    path = write_config(tmp_path / "run.yaml", **config)
    code = main(["train", "--config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _bad_input_cases(tmp_path, tiny_target):
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tiny_target / "config.json", no_weights / "config.json")
    (tmp_path / "not_hf").mkdir()
    return {
        "missing target": ({"target_path": str(tmp_path / "nowhere")}, "does not exist"),
        "not a HF dir": ({"target_path": str(tmp_path / "not_hf")}, "not a Hugging Face model directory"),
        "no weights": ({"target_path": str(no_weights)}, "no model weights"),
        "no loss_mask": ({"data_path": str(write_dataset(tmp_path / "cols", [40, 50], columns=("input_ids",)))},
                         "lacks the column(s) loss_mask"),
        "empty dataset": ({"data_path": str(write_dataset(tmp_path / "empty", []))}, "is empty"),
        "missing dataset": ({"data_path": str(tmp_path / "no_data")}, "does not exist"),
        "typo": ({"num_anchor": 8}, "unknown key 'num_anchor' (did you mean 'num_anchors'?)"),
        "budget": ({"token_budget": 300}, "token_budget=300 is smaller than the longest bucket (511 tokens)"),
        "layer ids": ({"target_layer_ids": [1, 6]}, "target_layer_ids [6] out of range"),
        "bad resume": ({"resume": str(tmp_path)}, "is not a complete checkpoint"),
    }


CASES = ["missing target", "not a HF dir", "no weights", "no loss_mask", "empty dataset", "missing dataset", "typo",
         "budget", "layer ids", "bad resume"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_before_models_load(case, tmp_path, capsys, base_config, tiny_target, no_model_loads):
    overrides, message = _bad_input_cases(tmp_path, tiny_target)[case]
    code, out, err = _train(tmp_path, capsys, {**base_config, **overrides})
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err and "Loading 1 target models" not in out


def test_unexpected_errors_print_a_traceback_and_exit_1(tmp_path, capsys, base_config, monkeypatch):
    import trainer.train

    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer.train, "train", explode)
    code, out, err = _train(tmp_path, capsys, base_config)
    assert code == 1 and "Traceback" in err and "RuntimeError: boom" in err
