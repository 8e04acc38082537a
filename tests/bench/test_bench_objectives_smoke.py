"""bench/bench_objectives.py end to end at its CPU smoke size, as a real process: bench_tau's target and data built
once, two objectives and the DFlash2 architecture trained at equal steps and at equal time (the slowest one's),
every checkpoint decoded by `trainer eval --tree-budget` on held-out prompts (DFlash2 along its selector's path),
and one table and one JSON object with every figure."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env


@pytest.mark.slow
def test_objectives_benchmark_runs_every_stage_on_the_cpu(tmp_path):
    command = [sys.executable, "bench/bench_objectives.py", "--tiny", "--objectives", "ce,kl,dflash2", "--workdir",
               str(tmp_path), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=trainer_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["device"] == "cpu" and result["steps"] == 4 and result["tree_budgets"] == [8, 32, 64]
    rows = {row["objective"]: row for row in result["rows"]}
    assert list(rows) == ["ce", "kl", "dflash2"] and result["block_size"] == 8 and result["seed"] == 0
    assert [row["architecture"] for row in rows.values()] == ["dflash", "dflash", "dflash2"]
    for row in rows.values():
        for part in (row["equal_steps"], row["equal_time"]):
            assert 1.0 <= part["chain_tau"] <= 8.0 and part["identical_to_greedy"]
            assert sorted(map(int, part["tree_tau"])) == [8, 32, 64] and part["trees_identical_to_greedy"]
            assert 0.0 <= part["acc"] <= 1.0 and part["seconds_per_step"] > 0
        assert row["equal_steps"]["steps"] == 4
    assert {"loss_kl"} <= rows["kl"]["equal_steps"]["terms"].keys()
    # equal time: the slowest variant keeps its run, the others get the steps that fit in the same seconds
    slow, *faster = sorted(rows.values(), key=lambda row: -row["seconds_per_step"])
    assert slow["equal_time"]["same_run_as_equal_steps"]
    for fast in faster:
        expected = result["equal_time_seconds"] / fast["seconds_per_step"]   # both rounded in the report
        assert abs(fast["equal_time"]["steps"] - expected) <= 1 or fast["equal_time"]["same_run_as_equal_steps"]
    assert result["markdown"].count("\n") == 4 and "| kl |" in result["markdown"]
    config = json.loads((tmp_path / "runs" / "dflash2-b8-s0-steps" / "step_4" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["dflash_config"]["block_size"] == 8
    # a second run in the same directory reuses the target, the runs and the evaluations
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=trainer_env(), cwd=REPO_ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the target and data" in again.stderr and "steps in" not in again.stderr.split("(a)")[1]
    assert json.loads(again.stdout)["rows"] == result["rows"]
