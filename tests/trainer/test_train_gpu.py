"""GPU variants (skipped without CUDA): the tiny end-to-end run on a GPU in bf16, and a short training on a
random target of a real shape (Qwen3-8B's config) that must log step lines; its throughput is printed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench.synthetic import write_random_dataset, write_random_target
from tests.trainer.conftest import run_trainer, write_config
from tests.trainer.test_train import step_records

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

def test_gpu_training_and_eval(base_config, tiny_target, self_generated, tmp_path):
    config = {**base_config, "device": "cuda", "drafter_layers": 2, "max_steps": 150, "log_every": 50}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config), gpu=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Target 0 on cuda:0..." in result.stdout
    records = step_records(Path(config["output_dir"]))
    assert records[-1]["loss"] < records[0]["loss"]
    # where each step's time went, from CUDA events: the GPU phases fit in the wall time (the host's data wait
    # may overlap them, so it is left out of the sum)
    for record in records:
        gpu_phases = record["target_s"] + record["drafter_s"] + record["optimizer_s"]
        assert min(record["target_s"], record["drafter_s"], record["optimizer_s"]) > 0, record
        assert gpu_phases <= record["step_s"] * 1.01, record
    assert result.stdout.count("  step times: data ") == len(records)
    for dtype in ("float32", "bfloat16"):
        report = run_trainer("eval", "--target", tiny_target, "--drafter", Path(config["output_dir"]) / "step_150",
                             "--prompts", self_generated["eval_prompts"], "--max-new-tokens", "64", "--json",
                             "--dtype", dtype, gpu=True)
        print(dtype, report.stdout.strip())
        # bf16: a verify pass may round a near-tie differently from one-token steps: a precision note, exit 0
        assert report.returncode == 0, report.stderr[-3000:]
        found = json.loads(report.stdout)
        assert found["tau"] > 1.2 and not found["failures"], found
        if dtype == "float32":
            assert found["identical_to_greedy"] and not found["precision_notes"]
        else:
            assert all(note["margin"] <= note["tolerance"] for note in found["precision_notes"])


def test_an_fp8_target_trains_with_its_layers_compiled_by_default(base_config, tmp_path):
    """target_precision: fp8 with compile_target left at auto: the target's FP8 layers compile at start-up, every
    batch shape reuses that graph, and the drafter learns."""
    config = {**base_config, "device": "cuda", "drafter_layers": 2, "max_steps": 40, "log_every": 10,
              "target_precision": "fp8"}
    result = run_trainer("train", "--config", write_config(tmp_path / "fp8.yaml", **config), gpu=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("Target: ") and "fp8 linear layers" in line for line in lines), result.stdout[-3000:]
    assert any(line.startswith("Kernels: ") and "; target layers: torch.compile; " in line for line in lines)
    assert any(line.endswith("compiling the target's layers") for line in lines)
    assert not [line for line in lines if " compiled " in line and "graph(s)" in line], result.stdout[-3000:]
    records = step_records(Path(config["output_dir"]))
    assert records[-1]["loss"] < records[0]["loss"]


@pytest.mark.slow
def test_real_shape_target_logs_step_lines(tmp_path):
    target = write_random_target(tmp_path / "qwen3-8b-random", "qwen3-8b")
    data = write_random_dataset(tmp_path / "data", samples=3000, min_len=256, max_len=3072, vocab=151936)
    steps = int(os.environ.get("DFLASH_GPU_STEPS", "30"))
    config = {"target_path": str(target), "data_path": str(data), "output_dir": str(tmp_path / "out"),
              "max_steps": steps, "buckets": [0, 1024, 2048, 3073], "max_length": 3072, "token_budget": 8192,
              "log_every": 5,
              "checkpoint_every": 0, "device": "cuda", "num_workers": 4}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config), gpu=True,
                         timeout=900)
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stderr[-5000:]
    records = step_records(Path(config["output_dir"]))
    assert len(records) == 1 + steps // 5 and all(np.isfinite(r["loss"]) for r in records)  # step 1, then every 5
    print("tok/s per log interval:", [round(r["tok_per_s"]) for r in records])
