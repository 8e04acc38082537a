"""bench/bench_tau.py end to end at its CPU smoke size, as a real process: a target LM trained on standard-library
source, its own answers generated, prepared with a held-out split, a drafter trained with eval_every, and
`trainer eval` on held-out prompts; every figure the GPU run reports is there and consistent."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env
from tests.trainer.tiny_models import tiny_target_dir  # noqa: F401  (fixture)


@pytest.mark.slow
def test_tau_benchmark_runs_every_stage_on_the_cpu(tmp_path, monkeypatch):
    done = subprocess.run([sys.executable, "bench/bench_tau.py", "--tiny", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=trainer_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    data, drafter, evaluated, tau = result["data"], result["drafter"], result["eval"], result["tau"]
    assert result["device"] == "cpu" and result["target"]["steps"] == 20 and result["target"]["parameters"] > 0
    assert data["heldout_samples"] > 0 and data["train_samples"] + data["heldout_samples"] <= data["prompts"] == 32
    assert drafter["steps"] == 6 and sorted(map(int, drafter["tau_heldout_by_step"])) == [1, 2, 3, 4, 5, 6]
    assert sum(drafter["accept_hist_heldout"]) == pytest.approx(1.0, abs=1e-3)
    assert evaluated["identical_to_greedy"] and evaluated["prompts"] == 3 and evaluated["rounds"] > 0
    assert all(1.0 <= tau[key] <= 8.0 for key in ("eval_heldout_prompts", "replay_heldout", "replay_train_batches",
                                                   "streak_plus_1"))
    assert tau["replay_over_eval"] == pytest.approx(tau["replay_heldout"] / tau["eval_heldout_prompts"], abs=1e-3)
    assert tau["streak_plus_1_over_eval"] == pytest.approx(tau["streak_plus_1"] / tau["eval_heldout_prompts"],
                                                           abs=1e-3)
    # tree τ per default budget: replayed on the held-out split and decoded by `trainer eval --tree-budget`
    assert sorted(result["tree_tau"], key=int) == ["8", "32", "64"]
    for tree in result["tree_tau"].values():
        assert 1.0 <= tree["eval_heldout_prompts"] <= 8.0 and 1.0 <= tree["replay_heldout"] <= 8.0
        assert tree["replay_over_eval"] == pytest.approx(tree["replay_heldout"] / tree["eval_heldout_prompts"],
                                                         abs=1e-3)
    # the run's own files stay in the work directory for a look afterwards
    assert (tmp_path / "drafter" / "metrics.jsonl").is_file() and (tmp_path / "dataset" / "heldout").is_dir()
    # the held-out batch the FP8 features' error is measured on (a GPU run's): every held-out sample, right-padded
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    import bench_tau

    input_ids, attention_mask = bench_tau.heldout_batch(tmp_path / "dataset", 32)
    assert len(input_ids) == min(32, data["heldout_samples"]) and input_ids.shape == attention_mask.shape
    assert attention_mask[:, 0].all() and (attention_mask[:, 1:] <= attention_mask[:, :-1]).all()


def test_the_fp8_features_error_is_measured_at_real_positions_per_tap(tiny_target_dir, monkeypatch):
    """bench_tau's FP8 figure beside τ: the tapped features of the FP8 target against its bf16 self (FP8 products
    emulated on the CPU), over all taps and per tap, padding left out."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    import bench_tau

    import torch

    lengths = (40, 23, 31)
    input_ids = torch.tensor([[(7 * i + j) % 300 for j in range(40)] for i in range(3)])
    attention_mask = (torch.arange(40)[None] < torch.tensor(lengths)[:, None]).long()
    found = bench_tau.fp8_feature_error(tiny_target_dir, input_ids, attention_mask, num_taps=3, device="cpu")
    assert found["tokens"] == 40 + 23 + 31 and len(found["per_tap_relative_error"]) == len(found["taps"]) == 3
    assert 0 < min(found["per_tap_relative_error"]) and found["relative_error"] < 0.25
    assert min(found["per_tap_relative_error"]) <= found["relative_error"] <= max(found["per_tap_relative_error"])
