"""Small CPU jobs run on one torch thread unless OMP_NUM_THREADS says otherwise: on a busy 2-core machine torch's
default of a thread per core made generate and train several times slower (bench/bench_threads.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env, write_config, write_prompts


def trainer(*args, omp: str | None) -> subprocess.CompletedProcess:
    env = trainer_env()
    env.pop("OMP_NUM_THREADS")
    env.pop("MKL_NUM_THREADS")
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO_ROOT)


@pytest.mark.parametrize(("omp", "one_thread"), [(None, True), ("2", False)])
def test_generate_takes_one_thread_for_a_small_target(tiny_target, tmp_path, omp, one_thread):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2, seed=0)
    done = trainer("generate", "--target", tiny_target, "--prompts", prompts, "--output", tmp_path / "out.jsonl",
                   "--max-new-tokens", 4, "--device", "cpu", omp=omp)
    assert done.returncode == 0, done.stderr
    said = "generate: one CPU thread (a target of hidden size 64; set OMP_NUM_THREADS to choose)"
    assert (said in done.stderr) is one_thread, done.stderr


def test_train_takes_one_thread_for_a_small_target(base_config, tmp_path):
    config = write_config(tmp_path / "run.yaml", **{**base_config, "max_steps": 1})
    done = trainer("train", "--config", config, omp=None)
    assert done.returncode == 0, done.stderr
    assert "train: one CPU thread (a target of hidden size 64; set OMP_NUM_THREADS to choose)" in done.stdout
