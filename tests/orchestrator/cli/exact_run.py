"""A run on `local` whose step line rounds its figures and whose metrics.jsonl has them exact, as the trainer
writes both (shared by the CLI and dashboard tests of the exact figures)."""
from __future__ import annotations

from dflash_records.step import StepRecord

from tests.lab.workloads import run_cli

EXACT_TOK_PER_S = 350.4


def step_metrics() -> StepRecord:
    return StepRecord(elapsed_s=70.0, step=7, loss=2.71828, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
                      tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=EXACT_TOK_PER_S, q_pre=[1], q_hs=[],
                      epoch=0.0, eta_s=60.0)


def launch_exact_run(inv: str, capsys) -> dict:
    """The step line first, its JSON record half a second later (the two files race in a real trainer too)."""
    line, record = step_metrics().to_line(), step_metrics().to_json()
    assert "(0.4Ktok/s)" in line  # what a view that reads the line shows: 400 tok/s
    script = 'printf "%s\\n" "$1"; sleep 0.5; printf "%s\\n" "$2" > "$DFLASH_RUN_DIR/metrics.jsonl"; sleep 60'
    code, run, err = run_cli(inv, "launch", "local", "--json", "--name", "exact", "--", "sh", "-c", script, "sh",
                             line, record, capsys=capsys)
    assert code == 0, err
    return run
