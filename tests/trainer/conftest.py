"""Shared fixtures of the trainer tests: a tiny target written locally, chats it generated itself, the dataset
prepared from them, and helpers to write configs and run `python -m trainer` as a real process."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FLA_INSTALLED = importlib.util.find_spec("fla") is not None
HYBRID_NAMES = ("qwen3.5", "hybrid", "composite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # With flash-linear-attention installed, transformers runs every hybrid model's linear layers with its CUDA-only
    # kernels, and the trainer refuses a hybrid target on the CPU by design: the CPU hybrid tests cannot run on
    # such a machine (a GPU box); its GPU tests cover those paths there.
    if not FLA_INSTALLED:
        return
    skip = pytest.mark.skip(reason="a CPU hybrid test, and flash-linear-attention is installed here")
    for item in items:
        if item.get_closest_marker("gpu") is None and any(name in item.nodeid.lower() for name in HYBRID_NAMES):
            item.add_marker(skip)

REPO_ROOT = Path(__file__).resolve().parents[2]


def trainer_env(*, gpu: bool = False, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # one thread each: the runs are deterministic and share the machine politely
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU tests stay on the CPU even on a GPU machine
    env.update(extra)
    return env


def run_trainer(*args: str, timeout: float = 300, gpu: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=trainer_env(gpu=gpu), cwd=REPO_ROOT)


def write_prompts(path: Path, count: int, *, seed: int) -> Path:
    from trainer.model.tiny_target import tokenizer_corpus

    rng = random.Random(seed)
    words = " ".join(tokenizer_corpus()).split()
    with path.open("w") as sink:
        for _ in range(count):
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(6, 16)))
            sink.write(json.dumps({"messages": [{"role": "user", "content": prompt}]}) + "\n")
    return path


def write_config(path: Path, **values) -> Path:
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    from trainer.model.tiny_target import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target", seed=0)


@pytest.fixture(scope="session")
def self_generated(tiny_target, tmp_path_factory) -> dict[str, Path]:
    """Prompts answered by the tiny target itself, prepared into a dataset, and four of them for eval."""
    from trainer.data.generate import generate
    from trainer.data.prepare import prepare

    root = tmp_path_factory.mktemp("self_generated")
    prompts = write_prompts(root / "prompts.jsonl", 48, seed=1)
    chats = root / "chats.jsonl"
    generate(target=tiny_target, prompts=prompts, output=chats, max_new_tokens=64, batch_size=48, device="cpu")
    dataset = root / "dataset"
    prepare(target=tiny_target, input_path=chats, output=dataset, block_size=8)
    # eval on prompts the drafter trained on: the tiny random target's greedy continuations of unseen
    # prompts are too little data to generalise from in a short CPU run; real speculative decoding through
    # the target still checks the mask, the labels and the shared LM head end to end
    eval_prompts = root / "eval_prompts.jsonl"
    eval_prompts.write_text("".join(prompts.read_text().splitlines(keepends=True)[:4]))
    return {"prompts": prompts, "chats": chats, "dataset": dataset, "eval_prompts": eval_prompts}


@pytest.fixture()
def base_config(tiny_target, self_generated, tmp_path) -> dict:
    """A small CPU training config over the self-generated dataset."""
    return {
        "target_path": str(tiny_target), "data_path": str(self_generated["dataset"]),
        "output_dir": str(tmp_path / "out"), "max_steps": 6, "block_size": 8, "num_anchors": 16,
        "drafter_layers": 1, "token_budget": 2048, "buckets": [0, 128, 256, 512], "lr": 3e-3,
        "warmup_ratio": 0.1, "log_every": 1, "checkpoint_every": 0, "seed": 0, "device": "cpu",
        "num_workers": 1, "prefetch": 2,
    }
