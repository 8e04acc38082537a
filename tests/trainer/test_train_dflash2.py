"""A DFlash2 run end to end on the tiny target: `train` with `architecture: dflash2` lowers the loss and ends with
a passing parity check; `check` names a wrong selector_top_k; `eval` decodes chains and trees identical to greedy;
`export` writes a DFlash2DraftModel directory."""
from __future__ import annotations

import json

import pytest

from tests.trainer.conftest import run_trainer, write_config
from tests.trainer.planning.test_parity import plant
from trainer.__main__ import main
from trainer.planning.parity import check_parity


@pytest.fixture(scope="module")
def trained(tiny_target, self_generated, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("dflash2_run")
    config = {"target_path": str(tiny_target), "data_path": str(self_generated["dataset"]),
              "output_dir": str(root / "out"), "max_steps": 12, "architecture": "dflash2", "selector_rank": 8,
              "selector_top_k": 4, "num_anchors": 16, "drafter_layers": 1, "token_budget": 2048,
              "buckets": [0, 128, 256, 512], "lr": 3e-3, "log_every": 1, "checkpoint_every": 0, "seed": 0,
              "device": "cpu", "num_workers": 1, "prefetch": 2, "eval_every": 12, "eval_samples": 2,
              "eval_tree_budgets": [4, 16],
              # the decay weights: a loss whose definition does not move with the drafter's confidence, so that its
              # fall over 12 steps at this high lr measures learning (D-PACE's weights grow as the drafter learns)
              "slot_weights": "decay"}
    result = run_trainer("train", "--config", write_config(root / "run.yaml", **config))
    assert result.returncode == 0, result.stderr[-3000:]
    return {"checkpoint": root / "out" / "step_12", "stdout": result.stdout, "root": root}


def test_training_lowers_the_loss_and_the_checkpoint_is_a_dflash2_one(trained, tiny_target):
    assert ("DFlash2: block 8, convolution of 2 taps by groups of 16, selector of rank 8 over the top 4"
            in trained["stdout"])
    records = [json.loads(line) for line in (trained["root"] / "out" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("event") == "step"]
    assert len(losses) == 12 and sum(losses[-3:]) < 0.9 * sum(losses[:3]), losses
    # the held-out evaluation replays the selector's chain and its paired trees
    heldout = [r for r in records if "tau_heldout" in r][-1]
    assert heldout["tau_heldout"] >= 1.0 and set(map(int, heldout["tau_tree_heldout"])) == {4, 16}
    config = json.loads((trained["checkpoint"] / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert config["auto_map"] == {"AutoModel": "dflash.DFlash2DraftModel"}
    nested = config["dflash_config"]
    assert {key: nested[key] for key in ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank",
                                         "selector_top_k")} == {"block_size": 8, "conv_kernel_size": 2,
                                                                "conv_group_size": 16, "selector_rank": 8,
                                                                "selector_top_k": 4}
    assert set(nested) >= {"mask_token_id", "target_layer_ids"}
    report = check_parity(tiny_target, trained["checkpoint"])
    assert report.ok and "dflash_config" in {c.key for c in report.checks}, report.lines()


@pytest.mark.parametrize(("changes", "key", "message"), [
    ({"dflash_config__selector_top_k": 0}, "dflash_config.selector_top_k", "not a positive integer"),
    ({"dflash_config__selector_top_k": 5000}, "dflash_config", "selector_top_k=5000 must be between 1 and"),
    ({"dflash_config__selector_top_k": 8}, "dflash_config.selector_top_k", "trained with selector_top_k 4"),
    ({"dflash_config__conv_group_size": 24}, "dflash_config", "conv_group_size=24 does not divide"),
    ({"dflash_config__selector_rank": 16}, "candidate_selector.predecessor_codebook", "is [320, 8]"),
])
def test_check_names_a_wrong_nested_size(trained, tiny_target, tmp_path, changes, key, message):
    report = check_parity(tiny_target, plant(trained["checkpoint"], tmp_path / "planted", **changes))
    failed = {check.key: check for check in report.failed}
    assert key in failed and message in failed[key].detail, report.lines()


def test_eval_chains_and_trees_are_identical_to_greedy(trained, tiny_target, self_generated):
    result = run_trainer("eval", "--target", tiny_target, "--drafter", trained["checkpoint"], "--prompts",
                         self_generated["eval_prompts"], "--max-new-tokens", "24", "--tree-budget", "4,16",
                         "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    for run in [report, report["baseline"], *report["trees"]]:
        assert run["identical_to_greedy"] and run["new_tokens"] == 4 * 24, run
    assert report["ok"] and not report["failures"]


def test_export_writes_a_dflash2_serving_directory(trained, tiny_target, tmp_path, capsys):
    out = tmp_path / "served"
    assert main(["export", str(trained["checkpoint"]), str(out)]) == 0, capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["dflash_config"]["selector_top_k"] == 4
    card = (out / "README.md").read_text()
    assert "| Architecture | DFlash2DraftModel |" in card and "top 4 candidates" in card
    assert check_parity(tiny_target, out).ok
