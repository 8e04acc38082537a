"""The trainer's log lines reproduce the seed trainer's lines byte for byte from the seed's own numbers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dflash_records.step import StepRecord, format_elapsed, format_eta, format_step_line, step_json
from trainer.logformat import (
    format_batches_line, format_bucket_table, format_dataset_lines, format_loading_targets, format_target_on,
)

from tests.seed_logs import SEED_STARTUP, SEED_STEPS

SEED_BOUNDS = [0, 770, 1216, 1728, 2432, 3296, 8193]
SEED_BUCKET_BATCHES = [2283, 4437, 6292, 9000, 9932, 27878]


def _seed_step(loss: float, acc: float, q_hs: int, tgt: float, eta_days: float) -> StepRecord:
    return StepRecord(
        elapsed_s=6 * 60 + 31.5, step=8, loss=loss, acc=acc, streak=0.0, lr=4.52e-06, noise=0.0003,
        tgt_batches_per_s=tgt, dft_batches_per_s=0.29, tok_per_s=11_700.0, q_pre=[50, 50, 50, 49, 50],
        q_hs=[q_hs], epoch=0.01, eta_s=eta_days * 86400,
    )


def test_step_lines_match_the_seed_log():
    fixture = SEED_STEPS.splitlines()
    ours = [
        format_step_line(_seed_step(12.5546, 0.025, 15, 0.34, 12.0)),
        format_step_line(_seed_step(13.0073, 0.011, 17, 0.35, 11.9)),
        format_step_line(_seed_step(12.9459, 0.019, 18, 0.35, 11.9)),
    ]
    assert ours[:2] == fixture[:2]
    cut = fixture[2].removesuffix("...")  # the fixture's last line was cut by the tool that displayed it
    assert ours[2].startswith(cut) and len(ours[2]) > len(cut)


def test_startup_lines_match_the_seed_log():
    fixture = SEED_STARTUP
    n_samples = 1095082
    n_batches = sum(SEED_BUCKET_BATCHES)
    ours = "\n".join([
        format_dataset_lines("/workspace/tokenized_completions", n_samples),
        format_batches_line(n_batches, min_size=6, max_size=64, avg_size=n_samples / n_batches),
        format_bucket_table(SEED_BOUNDS, SEED_BUCKET_BATCHES),
        format_loading_targets(5),
        format_target_on(0, "cuda:0"),
    ]) + "\n"
    assert ours == fixture


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.9, "59s"), (60, "1m00s"), (65, "1m05s"), (119.9, "1m59s"), (299, "4m59s"), (300, "5m"),
    (391, "6m"), (3599, "59m"), (3600, "1h00m"), (7 * 3600 + 125, "7h02m"),
])
def test_elapsed_format(seconds, text):
    assert format_elapsed(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "?"), (float("inf"), "?"), (45, "45.0s"), (90, "1.5m"), (5.25 * 3600, "5.2h"),
    (86400 * 12, "12.0d"), (86399, "24.0h"),
])
def test_eta_format(seconds, text):
    assert format_eta(seconds) == text


def test_metrics_json_has_every_field_of_the_step_line():
    metrics = _seed_step(12.5546, 0.025, 15, 0.34, 12.0)
    record = json.loads(step_json(metrics))
    assert record["event"] == "step"
    assert record["step"] == 8 and record["loss"] == 12.5546 and record["q_pre"] == [50, 50, 50, 49, 50]
    assert record["eta_s"] == pytest.approx(12.0 * 86400)
    assert "\n" not in step_json(metrics)


def test_metrics_json_is_strict_json_for_nan_loss():
    metrics = _seed_step(float("nan"), 0.0, 0, 0.3, 1.0)
    line = step_json(metrics)
    assert "NaN" not in line and json.loads(line)["loss"] is None


def test_logformat_and_config_do_not_import_torch():
    import subprocess
    code = "import sys, trainer.logformat, trainer.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
