"""The sharded optimizer (ZeRO-1) in real trainer runs: two gloo ranks under torchrun give the same losses and
weights as the unsharded optimizer, checkpoints hold the whole optimizer state and resume either way, and the
one-process memory check keeps exactly rank 0's share."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO_ROOT, run_trainer, trainer_env, write_config
from tests.trainer.test_train import step_records


def torchrun(config_path: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainer", "train", "--config", str(config_path)],
        capture_output=True, text=True, timeout=300, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def weights(step_dir: Path) -> dict:
    """The weights training left: the fp32 master weights of a checkpoint whose model.safetensors is bf16."""
    from safetensors.torch import load_file

    master = step_dir / "master_weights.safetensors"
    return load_file(str(master if master.is_file() else step_dir / "model.safetensors"))


def optimizer_state(step_dir: Path) -> dict:
    import torch

    return torch.load(step_dir / "training_state.pt", map_location="cpu", weights_only=False)["optimizer"]


def assert_same_tensors(a: dict, b: dict) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_two_ranks_sharded_give_the_unsharded_losses_and_weights_after_3_steps(base_config, tmp_path):
    runs = {}
    for shard in (True, False):
        config = {**base_config, "max_steps": 3, "shard_optimizer": shard, "output_dir": str(tmp_path / str(shard))}
        runs[shard] = (config, torchrun(write_config(tmp_path / f"{shard}.yaml", **config)))
    (sharded, sharded_run), (whole, whole_run) = runs[True], runs[False]
    assert "Optimizer: AdamW, states sharded 2 ways (ZeRO-1): rank 0 keeps" in sharded_run.stdout
    assert "Optimizer: AdamW, states whole on every rank" in whole_run.stdout
    digests = dict(re.findall(r"rank (\d+) drafter weights digest ([0-9a-f]{16})", sharded_run.stdout))
    assert sorted(digests) == ["0", "1"] and digests["0"] == digests["1"]   # the shards were broadcast
    losses = {shard: [r["loss"] for r in step_records(Path(config["output_dir"]))]
              for shard, (config, _) in runs.items()}
    assert len(losses[True]) == 3 and losses[True] == losses[False]
    assert losses[True][0] != losses[True][2]                               # the steps changed the weights
    step_3 = {shard: Path(config["output_dir"]) / "step_3" for shard, (config, _) in runs.items()}
    assert_same_tensors(weights(step_3[True]), weights(step_3[False]))
    # the checkpoint holds the whole optimizer state, gathered from both ranks, in AdamW's own layout
    gathered, plain = optimizer_state(step_3[True]), optimizer_state(step_3[False])
    assert sorted(gathered["state"]) == sorted(plain["state"]) == list(range(len(plain["state"])))
    for index, state in plain["state"].items():
        assert_same_tensors(gathered["state"][index], state)
    assert [g["params"] for g in gathered["param_groups"]] == [g["params"] for g in plain["param_groups"]]


def test_a_sharded_checkpoint_resumes_sharded_and_unsharded_with_the_same_steps(base_config, tmp_path):
    config = {**base_config, "max_steps": 4, "checkpoint_every": 2, "keep_checkpoints": 0,
              "output_dir": str(tmp_path / "first")}
    torchrun(write_config(tmp_path / "first.yaml", **config))
    first = Path(config["output_dir"])
    reference = {r["step"]: r["loss"] for r in step_records(first)}
    for shard in (True, False):
        resumed = {**config, "shard_optimizer": shard, "resume": str(first / "step_2"),
                   "output_dir": str(tmp_path / f"resumed-{shard}")}
        result = torchrun(write_config(tmp_path / f"resumed-{shard}.yaml", **resumed))
        assert f"Resumed from {first / 'step_2'} at step 2" in result.stdout
        records = step_records(Path(resumed["output_dir"]))
        assert {r["step"]: r["loss"] for r in records} == {3: reference[3], 4: reference[4]}, shard
        assert_same_tensors(weights(Path(resumed["output_dir"]) / "step_4"), weights(first / "step_4"))


def test_simulated_shards_keep_rank_0s_share_and_update_only_it(base_config, tiny_target, tmp_path):
    """One process holding what rank 0 of 3 would: AdamW over rank 0's share (the partition
    ZeroRedundancyOptimizer makes, largest first), so only those weights move from their initial values."""
    import torch

    from tests.trainer.test_train import write_untrained_drafter
    from trainer.planning.memory_plan import zero_partition

    config = {**base_config, "max_steps": 2, "simulate_shards": 3}
    result = run_trainer("train", "--config", write_config(tmp_path / "sim.yaml", **config))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(rank 0 of 3, simulated): " in result.stdout   # the plan of rank 0's share (of the CPU process here)
    untrained = write_untrained_drafter(tiny_target, tmp_path / "init", layers=1, block_size=8)
    initial, trained = weights(untrained), weights(Path(config["output_dir"]) / "step_2")
    order = parameter_order(untrained)
    share = {order[i] for i in zero_partition([initial[name].numel() for name in order], 3)[0]}
    assert 0 < len(share) < len(order)
    assert f"states for {sum(initial[n].numel() for n in share) / 1e6:.2f}M of" in result.stdout
    assert {name for name in order if not torch.equal(initial[name], trained[name])} == share


def parameter_order(drafter_dir: Path) -> list[str]:
    """The drafter's parameter names in parameters() order (the order the optimizer and ZeRO see)."""
    import torch

    from trainer.model.drafter_files import load_drafter

    config = json.loads((drafter_dir / "config.json").read_text())
    embed = torch.nn.Embedding(config["vocab_size"], config["hidden_size"])
    head = torch.nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
    return [name for name, _ in load_drafter(drafter_dir, embed_tokens=embed, lm_head=head).named_parameters()]


def test_simulated_shards_are_refused_under_torchrun(base_config, tmp_path):
    config = {**base_config, "simulate_shards": 2}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainer", "train", "--config", str(write_config(tmp_path / "sim2.yaml", **config))],
        capture_output=True, text=True, timeout=300, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode != 0
    assert "error: simulate_shards: 2 is a memory check for one process; this run has 2" in result.stderr
    assert "Loading" not in result.stdout   # refused at start-up, before the target


@pytest.mark.parametrize("value", ["auto", True, False])
def test_shard_optimizer_accepts_auto_true_false(value):
    from trainer.planning.memory_plan import sharding_ways

    ways = {w: sharding_ways(value, w) for w in (1, 4)}
    assert ways == {"auto": {1: 1, 4: 4}, True: {1: 1, 4: 4}, False: {1: 1, 4: 1}}[value]
