"""`watch --once --json` shows a run's exact figures from its metrics.jsonl, not the rounded ones of its log line
(a 350 tok/s step line reads `(0.3Ktok/s)`, which parsed back is 300)."""
from __future__ import annotations

import os
import time

from tests.lab.workloads import run_cli

from .exact_run import EXACT_TOK_PER_S, launch_exact_run


def test_watch_once_json_shows_the_tok_per_s_of_metrics_jsonl_not_of_the_rounded_line(inv, capsys):
    record = launch_exact_run(inv, capsys)
    deadline = time.monotonic() + 30
    try:
        while True:
            code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", capsys=capsys)
            run = next(r for r in snapshot["runs"] if r["run_id"] == record["run_id"])
            if run["last_step"] == 7 and run["tok_per_s"] == EXACT_TOK_PER_S:
                break
            assert time.monotonic() < deadline, (run["last_step"], run["tok_per_s"], err)
            time.sleep(0.2)
        assert run["loss"] == 2.71828 and run["history"][-1]["tok_per_s"] == EXACT_TOK_PER_S
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_watch_once_json_says_why_a_target_without_nvidia_smi_has_no_gpu_samples(inv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.pathsep.join((str(tmp_path), "/usr/bin", "/bin")))  # no nvidia-smi on it
    code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", capsys=capsys)
    assert code == 0, err
    assert snapshot["gpus"] == [] and snapshot["gpu_errors"] == {"local": "nvidia-smi is not installed"}
