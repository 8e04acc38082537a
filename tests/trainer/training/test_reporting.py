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


def test_trackers_get_the_metrics_of_a_step_not_the_records_version_or_the_world_size(tmp_path, monkeypatch):
    """`v` (metrics.jsonl's schema) and `world_size` are facts of the record and the run: as series they were two
    flat lines in every run's charts."""
    from dflash_records.step import StepRecord
    from trainer.training.metrics import MetricsLog

    class Recorder:
        def __init__(self) -> None:
            self.steps: list[tuple[int, dict[str, float]]] = []

        def step(self, step: int, numbers: dict[str, float]) -> None:
            self.steps.append((step, numbers))

        def close(self) -> None:
            pass

    monkeypatch.delenv("DFLASH_RUN_DIR", raising=False)
    recorder = Recorder()
    log = MetricsLog(tmp_path, enabled=True, reporters=[recorder])
    record = StepRecord(elapsed_s=12.0, step=7, loss=2.5, acc=0.4, streak=1.5, lr=1e-4, noise=0.0,
                        tgt_batches_per_s=1.0, dft_batches_per_s=2.0, tok_per_s=11734.0, q_pre=[3], q_hs=[1],
                        epoch=0.5, eta_s=60.0)
    log.step(record, data_position=[0, 7], world_size=2, step_s=0.9)
    log.close()
    written = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert written["v"] >= 1 and written["world_size"] == 2  # the record still carries both
    [(step, numbers)] = recorder.steps
    assert step == 7 and not {"v", "world_size", "step", "data_position", "q_pre"} & set(numbers), numbers
    assert numbers["loss"] == 2.5 and numbers["tok_per_s"] == 11734.0 and numbers["step_s"] == 0.9
