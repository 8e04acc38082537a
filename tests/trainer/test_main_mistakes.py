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


def assert_no_progress_bars(result) -> None:
    """A tqdm bar redraws itself with carriage returns: in a run's train.log every redraw stays."""
    assert "\r" not in result.stdout + result.stderr and "it/s]" not in result.stderr, result.stderr


def test_tiny_target_refuses_to_overwrite_a_model_and_writes_readable_weights(tmp_path):
    out = tmp_path / "target"
    first = run_trainer("tiny-target", out)
    assert first.returncode == 0, first.stderr
    assert_no_progress_bars(first)  # transformers' "Writing model shards", as its "Loading weights" in a run
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


@pytest.fixture(scope="module")
def drafter_checkpoint(tmp_path_factory, tiny_target):
    """A real drafter checkpoint of the tiny target (untrained: export needs its files, not its skill)."""
    import torch

    from tests.trainer.tiny_models import make_drafter
    from trainer.model.drafter_files import save_drafter
    from trainer.model.target import TargetModel

    target = TargetModel.load(tiny_target, layer_ids=None, num_taps=3, device=torch.device("cpu"),
                              dtype=torch.float32)
    checkpoint = tmp_path_factory.mktemp("drafter") / "step_1"
    save_drafter(make_drafter(target, num_layers=1), checkpoint)
    return checkpoint


@pytest.fixture()
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    return path


def test_export_to_where_nothing_can_be_made_is_one_line(drafter_checkpoint, a_file):
    line = one_line_refusal(run_trainer("export", drafter_checkpoint, "/proc/nope", "--no-check"))
    assert line.startswith("error: cannot write the export to /proc/nope: ")
    line = one_line_refusal(run_trainer("export", drafter_checkpoint, a_file / "out", "--no-check"))
    assert line == f"error: cannot write the export to {a_file / 'out'}: {a_file} is a file, not a directory"
    assert a_file.read_text() == "mine\n"


def test_tiny_target_where_nothing_can_be_made_is_one_line(a_file):
    assert one_line_refusal(run_trainer("tiny-target", "/proc/x")).startswith(
        "error: cannot create the directory /proc/x: ")
    line = one_line_refusal(run_trainer("tiny-target", a_file / "target"))
    assert line == f"error: cannot create the directory {a_file / 'target'}: {a_file} is a file, not a directory"
    for force in ((), ("--force",)):  # a file is never written over, and --force is no advice for one
        line = one_line_refusal(run_trainer("tiny-target", a_file, *force))
        assert line == f"error: {a_file} exists and is not a directory: give a new directory for the model"
    assert a_file.read_text() == "mine\n"


def _chats(path):
    from tests.trainer.conftest import write_prompts

    prompts = write_prompts(path.with_suffix(".prompts"), 16, seed=3)
    with path.open("w") as sink:
        for line in prompts.read_text().splitlines():
            chat = json.loads(line)["messages"]
            answer = " ".join([chat[0]["content"]] * 8)
            sink.write(json.dumps({"messages": [*chat, {"role": "assistant", "content": answer}]}) + "\n")
    return path


def test_prepare_refuses_to_write_over_a_file_or_a_dataset_without_force(tiny_target, tmp_path, a_file):
    chats = _chats(tmp_path / "chats.jsonl")
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output", a_file))
    assert line == f"error: --output {a_file} exists and is not a directory: give a new directory for the dataset"
    assert a_file.read_text() == "mine\n"
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output",
                                        a_file / "ds"))
    assert line == f"error: cannot write the dataset to {a_file / 'ds'}: {a_file} is a file, not a directory"

    dataset = tmp_path / "ds"
    first = run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output", dataset, "--heldout", "0.5")
    assert first.returncode == 0, first.stderr
    assert_no_progress_bars(first)  # datasets' "Saving the dataset"
    assert "held out: 0" not in first.stdout and "held out: none" not in first.stdout, first.stdout
    assert (dataset / "heldout").is_dir()
    before = sorted(path.name for path in dataset.iterdir())
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output", dataset,
                                        "--heldout", "0"))
    assert line == f"error: --output {dataset} holds a dataset already (--force replaces it)"
    assert sorted(path.name for path in dataset.iterdir()) == before
    forced = run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output", dataset, "--heldout", "0",
                         "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (dataset / "heldout").exists()  # replaced whole: no split of the old dataset left behind
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work\n")
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output", theirs,
                                        "--force"))
    assert "holds something other than a dataset" in line
    assert (theirs / "thesis.tex").read_text() == "years of work\n"


def test_prepare_refuses_an_input_that_is_not_utf8_naming_its_line(tiny_target, tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(json.dumps({"prompt": "hi", "completion": "ho"}).encode() + b"\n\xff\xfe{}\n")
    line = one_line_refusal(run_trainer("prepare", "--target", tiny_target, "--input", chats, "--output",
                                        tmp_path / "ds"))
    assert line.startswith(f"error: {chats}:2: not UTF-8 text (byte 0xff at offset 0 of the line)")
    assert not (tmp_path / "ds").exists()


def test_generate_refuses_an_output_that_is_a_directory_or_under_a_file(tiny_target, tmp_path, a_file):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    line = one_line_refusal(run_trainer("generate", "--target", tiny_target, "--prompts", prompts, "--output",
                                        tmp_path, "--device", "cpu"))
    assert line.startswith(f"error: --output {tmp_path} is a directory: give the JSONL file")
    line = one_line_refusal(run_trainer("generate", "--target", tiny_target, "--prompts", prompts, "--output",
                                        a_file / "answers.jsonl", "--device", "cpu"))
    assert line == (f"error: cannot write the answers to {a_file / 'answers.jsonl'}: {a_file} is a file, "
                    "not a directory")
