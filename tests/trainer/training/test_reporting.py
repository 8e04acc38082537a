"""`report_to:` a short CPU run writes TensorBoard event files that read back with every logged step's numbers,
the τ figures and the resolved config, under the run's name; a tracker whose package is missing is refused in
one line before anything loads."""
from __future__ import annotations

import importlib.util
import json

import pytest

from tests.trainer.conftest import run_trainer, write_config


def test_tensorboard_gets_every_logged_step_and_the_config(base_config, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    config = write_config(tmp_path / "run.yaml", **{**base_config, "output_dir": str(out), "max_steps": 4,
                                                     "log_every": 2, "report_to": ["tensorboard"]})
    done = run_trainer("train", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "Reporting to tensorboard as out" in done.stdout
    runs = list((out / "tensorboard").iterdir())
    assert [run.name for run in runs] == ["out"]  # the run's name (DFLASH_RUN_ID under dflashctl)
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if record.get("event") == "step"]
    assert [s["step"] for s in steps] == [1, 2, 4]
    scalars = events.Tags()["scalars"]
    for key in ("loss", "acc", "lr", "tok_per_s", "tau_replay"):
        assert f"train/{key}" in scalars, scalars
        read = [(event.step, event.value) for event in events.Scalars(f"train/{key}")]
        assert read == [(s["step"], pytest.approx(s[key], rel=1e-6)) for s in steps if key in s], key
    assert "config/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "report_to:" in text and "max_steps: 4" in text


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_refused_in_one_line(base_config, tmp_path, tracker):
    if importlib.util.find_spec(tracker) is not None:
        pytest.skip(f"{tracker} is installed here")
    config = write_config(tmp_path / "run.yaml", **{**base_config, "report_to": [tracker]})
    for command in (("check", "--config", config), ("train", "--config", config)):
        done = run_trainer(*command)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"report_to: {tracker} needs the {tracker} package" in done.stderr
        assert f"pip install {tracker}" in done.stderr


def test_an_unknown_tracker_names_the_ones_there_are(base_config, tmp_path):
    config = write_config(tmp_path / "run.yaml", **{**base_config, "report_to": ["comet"]})
    done = run_trainer("check", "--config", config)
    assert done.returncode == 2 and "report_to" in done.stderr and "'tensorboard'" in done.stderr, done.stderr
