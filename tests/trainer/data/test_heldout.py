"""prepare's held-out split (deterministic, by chat, never trained on) and a real training run that reports
tau_replay on logged steps and tau_heldout / tau_tree_heldout / tau_eval every eval_every steps, in both log
formats."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.trainlog.parser import parse_step_line
from tests.trainer.conftest import run_trainer, write_config
from tests.trainer.test_train import step_records


def sample_set(path: Path) -> set[tuple[int, ...]]:
    from trainer.data.batches import open_dataset

    dataset = open_dataset(path)
    ids, _ = dataset.rows(list(range(len(dataset))))
    return {tuple(row.tolist()) for row in ids}


@pytest.fixture(scope="module")
def split(tiny_target, self_generated, tmp_path_factory) -> dict:
    from trainer.data.prepare import prepare

    root = tmp_path_factory.mktemp("split")
    report = prepare(target=tiny_target, input_path=self_generated["chats"], output=root / "ds", block_size=8,
                     heldout=0.25)
    return {"root": root, "report": report, "dataset": root / "ds"}


def test_prepare_sets_aside_a_deterministic_heldout_share(tiny_target, self_generated, split):
    from trainer.data.prepare import prepare

    report, root = split["report"], split["root"]
    train, held = sample_set(split["dataset"]), sample_set(split["dataset"] / "heldout")
    assert report.set_aside == len(held) and report.kept == len(train)
    assert report.kept + report.set_aside == report.records - report.too_few_supervised
    assert 4 <= report.set_aside <= 20 and not train & held  # about a quarter of 48, never in both
    # the same chats in reverse order (generate writes answers as they finish): the same split
    lines = self_generated["chats"].read_text().splitlines(keepends=True)
    (root / "reversed.jsonl").write_text("".join(reversed(lines)))
    again = prepare(target=tiny_target, input_path=root / "reversed.jsonl", output=root / "again", block_size=8,
                    heldout=0.25)
    assert sample_set(root / "again" / "heldout") == held and again.set_aside == report.set_aside
    none = prepare(target=tiny_target, input_path=self_generated["chats"], output=root / "none", block_size=8,
                   heldout=0)
    assert none.set_aside == 0 and not (root / "none" / "heldout").exists()
    assert len(sample_set(root / "none")) == len(train | held)


def test_prepare_refuses_a_share_out_of_range(tiny_target, self_generated, tmp_path):
    result = run_trainer("prepare", "--target", tiny_target, "--input", self_generated["chats"], "--output",
                         tmp_path / "ds", "--heldout", "1.5")
    assert result.returncode == 2 and "held-out share must be in [0, 1), got 1.5" in result.stderr
    assert "Traceback" not in result.stderr


def test_training_reports_replayed_and_heldout_tau(base_config, split, tmp_path):
    config = {**base_config, "data_path": str(split["dataset"]), "max_steps": 6, "log_every": 2, "eval_every": 3,
              "eval_samples": 4, "eval_prompts": 2, "eval_max_new_tokens": 12, "replay_sequences": 2}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config))
    assert result.returncode == 0, result.stderr[-3000:]
    records = {r["step"]: r for r in step_records(Path(config["output_dir"]))}
    assert sorted(records) == [1, 2, 3, 4, 6]  # step 3 is logged for its evaluation
    for record in records.values():
        assert 1.0 <= record["tau_replay"] <= 8 and len(record["accept_hist"]) == 8
        assert sum(record["accept_hist"]) == pytest.approx(1.0, abs=1e-3)
    for step in (3, 6):
        assert 1.0 <= records[step]["tau_heldout"] <= 8 and 1.0 <= records[step]["tau_eval"] <= 8
        assert records[step]["eval_rounds"] > 0 and len(records[step]["accept_hist_heldout"]) == 8
        trees = records[step]["tau_tree_heldout"]  # the default budgets; a tree holds its chain's best path
        assert sorted(trees, key=int) == ["8", "32", "64"] and all(1.0 <= tau <= 8 for tau in trees.values())
    assert all("tau_heldout" not in records[step] and "tau_tree_heldout" not in records[step] for step in (1, 2, 4))
    # the human step lines carry the same figures, and the controller's parser reads them
    lines = [parse_step_line(line) for line in result.stdout.splitlines() if " step=" in line and "loss=" in line]
    by_step = {event.step: event for event in lines if event is not None}
    assert not by_step[3].partial and by_step[3].tau_heldout == pytest.approx(records[3]["tau_heldout"], abs=5e-4)
    budgets, taus = zip(*by_step[6].tau_tree_heldout)
    assert budgets == (8, 32, 64) and taus == pytest.approx([records[6]["tau_tree_heldout"][str(b)] for b in budgets],
                                                            abs=5e-4)
    assert by_step[4].tau_tree_heldout is None
    assert by_step[2].tau_replay == pytest.approx(records[2]["tau_replay"], abs=5e-4)
    assert by_step[2].tau_heldout is None and by_step[6].tau_eval == pytest.approx(records[6]["tau_eval"], abs=5e-4)


def test_eval_every_without_a_heldout_split_is_a_config_error(base_config, tmp_path):
    config = {**base_config, "heldout_path": str(tmp_path / "nowhere"), "eval_every": 2}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"eval_every=2 needs a held-out split and {tmp_path / 'nowhere'} does not exist" in result.stderr

