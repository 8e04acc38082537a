"""The step record's two encodings, written and read by the same code: its metrics.jsonl line exact, its human
line as the seed trainer's format rounds it. (The writer's lines against the controller's stream parser, and
fuzzing, are in tests/orchestrator/trainlog/test_logparse.py.)"""
from __future__ import annotations

import json
import math

from dflash_records.step import RECORD_FIELDS, StepRecord

WRITTEN = StepRecord(elapsed_s=391.5, step=8, loss=12.5546, acc=0.025, streak=0.0, lr=4.52e-06, noise=0.0003,
                     tgt_batches_per_s=0.34, dft_batches_per_s=0.29, tok_per_s=350.0, q_pre=[50, 49], q_hs=[15],
                     epoch=0.01, eta_s=12 * 86400.0, tau_heldout=1.79, tau_tree_heldout={32: 2.93, 8: 2.41})


def test_the_record_takes_lists_and_a_tree_dict_and_keeps_tuples():
    assert (WRITTEN.q_pre, WRITTEN.q_hs) == ((50, 49), (15,))
    assert WRITTEN.tau_tree_heldout == ((8, 2.41), (32, 2.93))


def test_its_metrics_jsonl_line_reads_back_exactly():
    line = WRITTEN.to_json(world_size=2)
    assert StepRecord.from_json(line) == WRITTEN
    record = json.loads(line)
    assert (record["event"], record["v"], record["world_size"]) == ("step", 1, 2)
    assert record["tau_tree_heldout"] == {"8": 2.41, "32": 2.93} and "tau_replay" not in record
    assert "partial" not in record and set(RECORD_FIELDS) - set(record) == {"tau_replay", "tau_eval"}


def test_its_human_line_rounds_as_the_seed_format_does():
    line = WRITTEN.to_line()
    assert line == ("[6m] step=8 loss=12.5546 acc=0.025 streak=0.0 lr=4.52e-06 noise=0.0003 | tgt=0.34b/s "
                    "dft=0.29b/s (0.3Ktok/s) | q_pre=[50, 49] q_hs=[15] | epoch~0.01 ETA=12.0d | "
                    "tau_heldout=1.790 tau_tree_heldout=8:2.410,32:2.930")
    read = StepRecord.from_line(line)
    assert not read.partial and read.tok_per_s == 300.0 and read.tau_tree_heldout == WRITTEN.tau_tree_heldout


def test_a_cut_line_is_partial_and_nan_is_strict_json():
    cut = StepRecord.from_line(WRITTEN.to_line()[:60])
    assert cut.partial and cut.step == 8 and cut.tok_per_s is None
    line = StepRecord(step=1, loss=math.nan).to_json()
    assert '"loss": null' in line and math.isnan(StepRecord.from_json(line).loss)
    assert StepRecord.from_json(line).partial
    assert StepRecord.from_line("saved checkpoint step=100") is None and StepRecord.from_json("{") is None
