"""A new user's mistakes with the trainer's commands: each one refused in one line with exit 2, never a
traceback, and nothing of theirs overwritten or left half-made."""
from __future__ import annotations

import json
import stat

import pytest

from tests.trainer.conftest import run_trainer


def one_line_refusal(result) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_tiny_target_refuses_to_overwrite_a_model_and_writes_readable_weights(tmp_path):
    out = tmp_path / "target"
    first = run_trainer("tiny-target", out)
    assert first.returncode == 0, first.stderr
    weights = out / "model.safetensors"
    assert stat.S_IMODE(weights.stat().st_mode) & 0o044 == 0o044  # group and others may read it, umask 022
    (out / "config.json").write_text(json.dumps({"model_type": "qwen3", "mine": True}))
    line = one_line_refusal(run_trainer("tiny-target", out, "--seed", "1"))
    assert str(out) in line and "--force" in line
    assert json.loads((out / "config.json").read_text())["mine"] is True
    assert run_trainer("tiny-target", out, "--force").returncode == 0
    assert "mine" not in json.loads((out / "config.json").read_text())


@pytest.mark.parametrize(("config", "expected"), [
    ({}, "no config.json"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not a supported target"),
])
def test_prepare_refuses_a_directory_that_is_not_a_target(tmp_path, config, expected):
    target = tmp_path / "notmodel"
    target.mkdir()
    if config:
        (target / "config.json").write_text(json.dumps(config))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"prompt": "hi", "completion": "ho"}) + "\n")
    line = one_line_refusal(run_trainer("prepare", "--target", target, "--input", chats, "--output", tmp_path / "ds"))
    assert expected in line
    assert not (tmp_path / "ds").exists()


def test_prepare_refuses_an_input_with_nothing_to_train_on(tiny_target, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", empty, "--output",
                                        tmp_path / "ds"))
    assert "has no records" in line
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"prompt": "hi", "completion": "ho"}) + "\n")
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", short, "--output",
                                        tmp_path / "ds"))
    assert "none of its 1 records is left to train on (1 with fewer than 2*block_size" in line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("command", [("check", "--config"), ("train", "--config"), ("train", "--plan", "--config")])
def test_a_config_that_is_not_utf8_is_refused_in_one_line(tmp_path, command):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"\xff\xfet\x00a\x00r\x00")  # UTF-16, as some editors save
    result = run_trainer(*command, config)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{config}: not UTF-8 text (byte 0xff at offset 0)" in result.stderr
