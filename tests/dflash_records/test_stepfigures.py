"""One rule for a step's figures in every view: its metrics.jsonl record where one came for that step, its log line
otherwise (a 350.4 tok/s step reads `(0.4Ktok/s)` in the log: 400 parsed back)."""
from __future__ import annotations

from dataclasses import replace

from dflash_records.answers import PsAnswer
from dflash_records.step import StepRecord, read_step_line
from dflash_records.stepfigures import latest_step, with_exact
from orchestrator.runs.client import with_metrics

EXACT = StepRecord(elapsed_s=70.0, step=7, loss=2.71828, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
                   tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=350.4, q_pre=(1,), q_hs=(), epoch=0.0,
                   eta_s=60.0)


def test_a_step_line_takes_the_figures_of_its_own_record_only():
    line = read_step_line(EXACT.to_line())
    assert line.tok_per_s == 400.0 and line.loss == 2.7183
    assert with_exact(line, EXACT).tok_per_s == 350.4 and with_exact(line, EXACT).loss == 2.71828
    assert with_exact(line, replace(EXACT, step=6)) is line and with_exact(line, None) is line
    assert latest_step(line, {6: replace(EXACT, step=6), 7: EXACT}).tok_per_s == 350.4
    assert latest_step(None, {6: replace(EXACT, step=6, tok_per_s=1.0), 7: EXACT}) is EXACT
    assert latest_step(None, {}) is None


def test_ps_reads_the_metrics_tail_where_the_agent_sends_one_and_the_line_from_an_agent_of_the_last_version():
    log = "Loading dataset...\n" + EXACT.to_line() + "\n"
    metrics = EXACT.to_json()[20:] + "\n" + replace(EXACT, step=6).to_json() + "\n" + EXACT.to_json() + "\n"
    new, old = (PsAnswer.from_dict({"ok": True, "runs": [run]}) for run in (
        {"run_id": "r-1", "log_tail": log, "metrics_tail": metrics},
        {"run_id": "r-1", "log_tail": log}))  # the last version's agent sends no metrics tail
    exact = with_metrics(new.runs[0], new.log_tails[0], new.metrics_tails[0])
    assert (exact.last_step, exact.tok_per_s) == (7, 350.4)
    assert "metrics_tail" not in exact.to_dict() and "log_tail" not in exact.to_dict()
    rounded = with_metrics(old.runs[0], old.log_tails[0], old.metrics_tails[0] if old.metrics_tails else None)
    assert (rounded.last_step, rounded.tok_per_s) == (7, 400.0)
