"""Train/serve parity and export on a checkpoint a real training run wrote: `check --target --drafter` passes on
it and fails, naming the key, on each planted mismatch; `export` writes a serving-only directory."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.trainer.conftest import run_trainer, write_config
from trainer.__main__ import main
from trainer.planning.parity import check_parity

TRAINING_ONLY = {"training_state.pt", "master_weights.safetensors", "trainer_config.json"}


@pytest.fixture(scope="module")
def trained(tiny_target, self_generated, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("parity_run")
    config = {"target_path": str(tiny_target), "data_path": str(self_generated["dataset"]),
              "output_dir": str(root / "out"), "max_steps": 3, "block_size": 8, "num_anchors": 16,
              "drafter_layers": 1, "token_budget": 2048, "buckets": [0, 128, 256, 512], "lr": 3e-3,
              "log_every": 1, "checkpoint_every": 0, "seed": 0, "device": "cpu", "num_workers": 1, "prefetch": 2}
    result = run_trainer("train", "--config", write_config(root / "run.yaml", **config))
    assert result.returncode == 0, result.stderr[-3000:]
    return {"checkpoint": root / "out" / "step_3", "stdout": result.stdout, "root": root}


def plant(checkpoint: Path, out: Path, **changes) -> Path:
    """A copy of the checkpoint's files with config.json keys changed (`a__b` is a["b"])."""
    shutil.copytree(checkpoint, out)
    config = json.loads((out / "config.json").read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = config
        for parent in parents:
            node = node[parent]
        node[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_training_ends_with_the_parity_check_and_it_passes(trained, tiny_target, capsys):
    lines = [line for line in trained["stdout"].splitlines() if line.startswith(("ok ", "FAIL"))]
    assert lines and all(line.startswith("ok ") for line in lines), lines
    assert any(line.startswith("ok   chat_template") for line in lines)
    records = [json.loads(line) for line in (trained["checkpoint"].parent / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r["event"] == "parity"][0]["ok"] is True
    code = main(["check", "--target", str(tiny_target), "--drafter", str(trained["checkpoint"]), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"] and {c["key"] for c in report["checks"]} >= {
        "dflash_config.mask_token_id", "dflash_config.target_layer_ids", "eagle_aux_hidden_state_layer_ids",
        "hidden_size", "vocab_size", "head_dim", "rope_theta", "rope_scaling", "block_size", "layer_types",
        "chat_template"}


PLANTED = {
    # an ordinary token of the tiny tokenizer (ids 0..3 are its special tokens)
    "wrong mask id": ({"dflash_config__mask_token_id": 100}, "dflash_config.mask_token_id", "ordinary token"),
    "mask id is the eos token": ({"dflash_config__mask_token_id": 2}, "dflash_config.mask_token_id",
                                 "the target's eos token"),
    "mask id past the embedding": ({"dflash_config__mask_token_id": 5000}, "dflash_config.mask_token_id",
                                   "outside the target's embedding"),
    "tap past the last layer": ({"dflash_config__target_layer_ids": [6]}, "dflash_config.target_layer_ids",
                                "past the target's layers (0..5)"),
    "aux ids not taps + 1": ({"eagle_aux_hidden_state_layer_ids": [2]}, "eagle_aux_hidden_state_layer_ids",
                             "target_layer_ids + 1 is"),
    "hidden size": ({"hidden_size": 128}, "hidden_size", "drafter 128, the target's 64"),
    "rope theta": ({"rope_theta": 1000000.0}, "rope_theta", "drafter 1000000.0, the target's 10000.0"),
    "rope scaling": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling", "drafter yarn"),
    "head dim": ({"head_dim": 32}, "head_dim", "drafter 32"),
    "block size": ({"block_size": 16}, "block_size", "trained with block_size 8"),
    "sliding layout": ({"use_sliding_window": True}, "layer_types", "use_sliding_window is True"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_planted_mismatch_fails_naming_its_key(trained, tiny_target, tmp_path, case):
    changes, key, message = PLANTED[case]
    report = check_parity(tiny_target, plant(trained["checkpoint"], tmp_path / "planted", **changes))
    assert not report.ok
    failed = {check.key: check for check in report.failed}
    assert key in failed, [c.line() for c in report.checks]
    assert message in failed[key].detail and failed[key].fix, failed[key].line()


def test_the_cli_exits_1_and_says_what_to_change(trained, tiny_target, tmp_path, capsys):
    planted = plant(trained["checkpoint"], tmp_path / "planted", dflash_config__target_layer_ids=[1, 9])
    assert main(["check", "--target", str(tiny_target), "--drafter", str(planted)]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert failing and failing[0].startswith("FAIL dflash_config.target_layer_ids: [9] past") and "fix:" in failing[0]
    assert "mismatch" in out.splitlines()[-1]


def test_a_target_without_chat_template_or_tokenizer_fails(trained, tiny_target, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_target, bare)
    (bare / "chat_template.jinja").unlink()
    report = check_parity(bare, trained["checkpoint"])
    assert [c.key for c in report.failed] == ["chat_template"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    assert "dflash_config.mask_token_id" in {c.key for c in check_parity(bare, trained["checkpoint"]).failed}


def test_usage_errors_exit_2(trained, tiny_target, tmp_path, capsys):
    assert main(["check", "--target", str(tiny_target)]) == 2
    assert "check needs --config FILE" in capsys.readouterr().err
    assert main(["check", "--target", str(tiny_target), "--drafter", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} is not a drafter checkpoint") and "Traceback" not in err


def test_export_writes_a_serving_only_directory(trained, tiny_target, tmp_path, capsys):
    out = tmp_path / "served"
    code = main(["export", str(trained["checkpoint"]), str(out), "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed
    assert json.loads(printed.out)["parity"]["ok"] is True
    names = {path.name for path in out.iterdir()}
    assert names == {"config.json", "model.safetensors", "dflash.py", "README.md"}
    assert not names & TRAINING_ONLY
    assert {path.stat().st_mode & 0o777 for path in out.iterdir()} == {0o644}
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["auto_map"]["AutoModel"] == "dflash.DFlashDraftModel"
    card = (out / "README.md").read_text()
    taps = config["dflash_config"]["target_layer_ids"]
    assert str(tiny_target) in card and f"{taps}" in card and "| Block size | 8 " in card
    assert "| Training steps | 3 |" in card and "| Training objective | ce, dpace slot weights |" in card
    # the exported directory is a drafter checkpoint of its own: the check passes on it too
    assert check_parity(tiny_target, out).ok


def test_export_card_shows_the_tau_figures_the_run_measured_up_to_the_checkpoint(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained["checkpoint"], run / "step_3")
    records = [{"event": "step", "step": 2, "loss": 1.0, "tau_heldout": 1.79, "tau_eval": 1.81},
               {"event": "step", "step": 3, "loss": 0.9, "tau_replay": 1.9},
               {"event": "step", "step": 4, "loss": 0.8, "tau_eval": 2.5}]  # after the checkpoint: not its figure
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    assert main(["export", str(run / "step_3"), str(tmp_path / "served"), "--no-check"]) == 0, capsys.readouterr()
    card = (tmp_path / "served" / "README.md").read_text()
    assert "| Eval tau | 1.81 (step 2) |" in card
    assert "| Held-out tau, replayed | chain 1.79 (step 2) |" in card


def test_export_writes_nothing_for_a_drafter_that_does_not_fit(trained, tiny_target, tmp_path, capsys):
    planted = plant(trained["checkpoint"], tmp_path / "planted", hidden_size=128)
    assert main(["export", str(planted), str(tmp_path / "served")]) == 1
    assert "FAIL hidden_size" in capsys.readouterr().out
    assert not (tmp_path / "served").exists()
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "keep").write_text("")
    assert main(["export", str(trained["checkpoint"]), str(tmp_path / "served")]) == 2  # not empty: refused
    assert "is not an empty directory" in capsys.readouterr().err


def test_the_parity_check_imports_no_torch(trained, tiny_target):
    import subprocess
    import sys

    from tests.trainer.conftest import REPO_ROOT, trainer_env

    probe = ("import sys; from trainer.__main__ import main; code = main(['check', '--target', sys.argv[1], "
             "'--drafter', sys.argv[2]]); heavy = sorted({'torch', 'numpy', 'pyarrow', 'transformers', 'safetensors'}"
             " & set(sys.modules)); print(code, heavy)")
    result = subprocess.run([sys.executable, "-c", probe, str(tiny_target), str(trained["checkpoint"])],
                            capture_output=True, text=True, env=trainer_env(), cwd=REPO_ROOT, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stdout + result.stderr


# what the model card reads of a checkpoint's config.json
CARD_CONFIG = {"dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 5}, "use_sliding_window": False,
               "num_hidden_layers": 1, "eagle_aux_hidden_state_layer_ids": [2, 4], "num_target_layers": 4,
               "block_size": 8, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def test_the_card_takes_the_latest_eval_and_heldout_tau_up_to_the_checkpoints_step(tmp_path):
    from trainer.export import model_card, training_facts

    checkpoint = tmp_path / "out" / "step_10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_config.json").write_text(json.dumps({"target_path": "/models/t"}))
    # tau_eval rides on the step records, as the trainer writes it (eval_prompts)
    records = [{"event": "step", "step": 5, "loss": 3.0, "tau_eval": 1.5},
               {"event": "step", "step": 8, "tau_heldout": 1.75, "tau_tree_heldout": {"32": 2.5, "8": 2.0}},
               {"event": "step", "step": 10, "tau_eval": 2.25}, {"event": "step", "step": 15, "tau_eval": 3.0},
               {"event": "step", "step": 9, "loss": 2.0},
               {"event": "step", "step": 12, "tau_heldout": 1.9, "tau_tree_heldout": {"8": 2.2, "32": 2.75}}]
    (tmp_path / "out" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{cut")
    facts = training_facts(checkpoint)
    assert facts == {"step": 10, "target": "/models/t", "tau": (2.25, 10),
                     "heldout": {"step": 8, "chain": 1.75, "trees": {8: 2.0, 32: 2.5}},
                     "objective": "ce, decay slot weights"}  # a run from before `loss:` existed
    card = model_card(CARD_CONFIG, facts, "bfloat16")
    assert "| Held-out tau, replayed | chain 1.75; DDTree 8 nodes 2.00, 32 nodes 2.50 (step 8) |" in card
    records[2] = {"event": "step", "step": 8, "tau_heldout": 1.75}  # a run with eval_tree_budgets: []
    (tmp_path / "out" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "| Held-out tau, replayed | chain 1.75 (step 8) |" in model_card(CARD_CONFIG, training_facts(checkpoint),
                                                                           "bfloat16")
    (tmp_path / "out" / "metrics.jsonl").unlink()
    assert training_facts(checkpoint)["tau"] is None and training_facts(checkpoint)["heldout"] is None
    assert "| Held-out tau, replayed | (not measured" in model_card(CARD_CONFIG, training_facts(checkpoint), "bf16")


def test_the_card_counts_a_one_layer_drafters_layers_in_the_singular():
    from trainer.export import model_card

    facts = {"step": 4, "target": "/models/t", "tau": None, "heldout": None}
    one = {**CARD_CONFIG, "num_attention_heads": 1, "num_key_value_heads": 1}
    assert "| Drafter | 1 layer, hidden 64, 1 head / 1 KV x 16, full attention in every layer |" in \
        model_card(one, facts, "bfloat16")
    windowed = {**CARD_CONFIG, "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"]}
    assert "| Drafter | 2 layers, hidden 64, 4 heads / 2 KV x 16, sliding window 32 on 1 of 2 layers |" in \
        model_card(windowed, facts, "bfloat16")


def test_the_card_names_the_objective_the_checkpoint_was_trained_with(tmp_path):
    from trainer.export import model_card, training_facts

    checkpoint = tmp_path / "out" / "step_4"
    checkpoint.mkdir(parents=True)
    trained = {"target_path": "/models/t", "loss": {"ce": 0.1, "cap": 0.9}, "slot_weights": "dpace"}
    (checkpoint / "trainer_config.json").write_text(json.dumps(trained))
    facts = training_facts(checkpoint)
    assert facts["objective"] == "0.1*ce + 0.9*cap, dpace slot weights"
    config = {"dflash_config": {"target_layer_ids": [1], "mask_token_id": 5}, "eagle_aux_hidden_state_layer_ids": [2],
              "num_target_layers": 4, "block_size": 8, "num_hidden_layers": 1, "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    assert "| Training objective | 0.1*ce + 0.9*cap, dpace slot weights |" in model_card(config, facts, "bfloat16")
    (checkpoint / "trainer_config.json").unlink()
    assert "| Training objective | (not recorded) |" in model_card(config, training_facts(checkpoint), "bfloat16")


def test_a_spare_embedding_row_past_the_tokenizer_is_a_mask_no_text_encodes_to(trained, tiny_target, tmp_path):
    """Qwen3's 151669: one past the tokenizer, inside the embedding the target pads to a round size."""
    padded = tmp_path / "padded"
    shutil.copytree(tiny_target, padded)
    config = json.loads((padded / "config.json").read_text())
    (padded / "config.json").write_text(json.dumps({**config, "vocab_size": 384}))
    planted = plant(trained["checkpoint"], tmp_path / "planted", vocab_size=384, dflash_config__mask_token_id=320)
    (mask,) = [c for c in check_parity(padded, planted).checks if c.key == "dflash_config.mask_token_id"]
    assert mask.ok and "spare embedding row past the tokenizer (320 tokens)" in mask.detail
    (mask,) = [c for c in check_parity(tiny_target, planted).checks if c.key == "dflash_config.mask_token_id"]
    assert not mask.ok and "outside the target's embedding (0..319)" in mask.detail
