"""The training config: every field documented and shown by --help; typos and bad values are clear errors."""
from __future__ import annotations

import pytest

from tests.trainer.conftest import run_trainer, write_config
from trainer.config import TrainConfig, config_from_dict, default_gamma, load_config
from trainer.errors import TrainerError

REQUIRED = {"target_path": "t", "data_path": "d", "output_dir": "o"}


def test_defaults_follow_the_recipe():
    config = config_from_dict(REQUIRED, source="x.yaml")
    assert (config.block_size, config.num_anchors, config.gamma, config.drafter_layers) == (16, 512, 7.0, 5)
    assert (config.lr, config.warmup_ratio, config.weight_decay, config.grad_clip) == (6e-4, 0.04, 0.0, 1.0)
    assert config.buckets == [0, 770, 1216, 1728, 2432, 3296, 8193] and config.token_budget == 49152
    assert config.max_length == 8192 and config.resume == "auto" and config.compile is False


def test_dflash2_defaults_follow_its_recipe_and_each_is_overridable():
    config = config_from_dict({**REQUIRED, "architecture": "dflash2"}, source="x.yaml")
    assert (config.block_size, config.gamma) == (8, 4.0)
    assert (config.conv_kernel_size, config.conv_group_size, config.selector_rank, config.selector_top_k) == (
        2, 16, 256, 16)
    config = config_from_dict({**REQUIRED, "architecture": "dflash2", "block_size": 16, "selector_top_k": 8,
                               "selector_rank": 64, "conv_group_size": 32}, source="x.yaml")
    assert (config.block_size, config.gamma, config.selector_top_k, config.selector_rank, config.conv_group_size) == (
        16, 7.0, 8, 64, 32)
    plain = config_from_dict(REQUIRED, source="x.yaml")
    assert (plain.architecture, plain.selector_top_k, plain.conv_group_size) == ("dflash", None, None)


@pytest.mark.parametrize(("block_size", "gamma"), [(16, 7.0), (10, 5.0), (8, 4.0), (12, 5.0)])
def test_gamma_default_depends_on_block_size(block_size, gamma):
    assert default_gamma(block_size) == gamma
    assert config_from_dict({**REQUIRED, "block_size": block_size}, source="x").gamma == gamma
    assert config_from_dict({**REQUIRED, "block_size": block_size, "gamma": 2.5}, source="x").gamma == 2.5


def test_every_field_has_a_description():
    undocumented = [name for name, info in TrainConfig.model_fields.items() if not info.description]
    assert undocumented == []


@pytest.mark.parametrize(("values", "message"), [
    ({"lrr": 1e-3}, "unknown key 'lrr' (did you mean 'lr'?)"),
    ({"output_dir": None}, "output_dir"),
    ({"token_budget": 4096}, "token_budget=4096 is smaller than the longest bucket (8192 tokens)"),
    ({"buckets": [0, 500, 400]}, "ascending"),
    ({"max_length": 9000}, "max_length=9000 does not fit"),
    ({"lr": "fast"}, "lr: Input should be a valid number"),
    ({"target_layer_ids": []}, "must not be empty"),
    ({"eval_tree_budgets": [8, 0]}, "eval_tree_budgets must be distinct node budgets from 1 to 1024, e.g. [8, 32, "
                                    "64], got [8, 0]"),
    ({"eval_tree_budgets": [32, 32]}, "got [32, 32]"),
    ({"eval_tree_budgets": [4096]}, "from 1 to 1024"),
    ({"eval_tree_budgets": "8,32"}, "eval_tree_budgets: Input should be a valid list"),
    ({"selector_top_k": 8}, "selector_top_k applies to architecture dflash2 only (architecture is dflash)"),
    ({"architecture": "dflash2", "conv_kernel_size": 3}, "conv_kernel_size=3 is not supported"),
    ({"architecture": "dflash2", "selector_rank": 0}, "selector_rank: Input should be greater than or equal to 1"),
    ({"architecture": "dflash3"}, "architecture: Input should be 'dflash' or 'dflash2'"),
])
def test_bad_values_name_the_key(tmp_path, values, message):
    data = {**REQUIRED, **values}
    data = {key: value for key, value in data.items() if value is not None}
    path = write_config(tmp_path / "run.yaml", **data)
    with pytest.raises(TrainerError) as error:
        load_config(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_yaml_syntax_error_is_a_trainer_error(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("target_path: [unclosed\n")
    with pytest.raises(TrainerError, match="invalid YAML"):
        load_config(path)


def test_cli_typo_exits_2_without_traceback(tmp_path):
    path = write_config(tmp_path / "run.yaml", **REQUIRED, epochz=3)
    result = run_trainer("train", "--config", path)
    assert result.returncode == 2
    assert "unknown key 'epochz' (did you mean 'epochs'?)" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_tree_budgets_default_to_the_evals_and_a_bad_one_exits_2_in_one_line(tmp_path):
    assert config_from_dict(REQUIRED, source="x").eval_tree_budgets == [8, 32, 64]
    assert config_from_dict({**REQUIRED, "eval_tree_budgets": []}, source="x").eval_tree_budgets == []
    path = write_config(tmp_path / "run.yaml", **REQUIRED, eval_tree_budgets=[64, -1])
    result = run_trainer("train", "--config", path)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    assert [line for line in result.stderr.splitlines() if "eval_tree_budgets" in line] == [
        f"error: {path}: eval_tree_budgets must be distinct node budgets from 1 to 1024, e.g. [8, 32, 64], "
        "got [64, -1]"]


def test_train_help_lists_every_config_key():
    result = run_trainer("train", "--help")
    assert result.returncode == 0
    for name in TrainConfig.model_fields:
        assert f"  {name} (" in result.stdout, name


def test_every_command_has_help():
    result = run_trainer("--help")
    assert result.returncode == 0
    for command in ("train", "check", "export", "prepare", "generate", "eval", "tiny-target"):
        assert command in result.stdout
        sub = run_trainer(command, "--help")
        assert sub.returncode == 0 and "usage:" in sub.stdout
        # a paragraph saying what it does between the usage and the options
        description = sub.stdout.split("\n\n")[1]
        assert not description.startswith(("options:", "optional arguments:")) and len(description) > 40, \
            (command, sub.stdout)


def test_tiny_target_command_writes_a_loadable_model(tmp_path):
    result = run_trainer("tiny-target", tmp_path / "tiny", "--seed", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(str(tmp_path / "tiny")).model_type == "qwen3"
    assert AutoTokenizer.from_pretrained(str(tmp_path / "tiny")).mask_token == "<|MASK|>"


@pytest.mark.parametrize(("budget", "batch", "anchors"), [(0, 64, 512), (4096, 4, 512), (4096, 16, 256),
                                                           (100, 300, 1), (None, 64, 48), (None, 6, 512)])
def test_anchor_budget_caps_blocks_per_batch(budget, batch, anchors):
    from trainer.train import anchors_per_sequence

    config = config_from_dict({**REQUIRED, "anchor_budget": budget}, source="x")
    assert anchors_per_sequence(config, batch) == anchors
