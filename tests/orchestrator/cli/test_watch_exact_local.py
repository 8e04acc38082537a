"""`ps` (its table and --json) and `watch --once --json` show a run's exact figures from its metrics.jsonl, not the
rounded ones of its log line (a 350.4 tok/s step line reads `(0.4Ktok/s)`, which parsed back is 400), and
`watch --once --json` is a bounded summary of each run."""
from __future__ import annotations

import os
import time

from tests.lab.workloads import STEP, run_cli
from tests.polling import wait_for

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


def test_ps_shows_the_tok_per_s_of_metrics_jsonl_in_its_table_and_json(inv, capsys, monkeypatch):
    record = launch_exact_run(inv, capsys)
    monkeypatch.setenv("COLUMNS", "200")
    try:
        def exact() -> dict | None:
            code, listed, err = run_cli(inv, "ps", "local", "--json", capsys=capsys)
            run = next(r for r in listed["runs"] if r["run_id"] == record["run_id"])
            return run if run["last_step"] == 7 and run["tok_per_s"] is not None else None
        run = wait_for(exact, 30, 0.5, what="the run's step 7 in ps")
        assert run["tok_per_s"] == EXACT_TOK_PER_S  # not the 400.0 of the line
        code, table, err = run_cli(inv, "ps", "local", capsys=capsys)
        row = next(line for line in table.splitlines() if record["run_id"] in line)
        assert code == 0 and row.split()[-2:] == ["7", "350"], row
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_watch_once_json_is_a_bounded_summary_with_more_on_asking(inv, capsys):
    steps = "\n".join(STEP.format(i=i) for i in range(1, 121))  # 120 steps, then quiet
    code, record, err = run_cli(inv, "launch", "local", "--json", "--name", "long", "--", "sh", "-c",
                                'printf "%s\\n" "$1"; sleep 60', "sh", steps, capsys=capsys)
    assert code == 0, err
    try:
        def run_of(*args: str) -> dict | None:
            code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", *args, capsys=capsys)
            run = next(r for r in snapshot["runs"] if r["run_id"] == record["run_id"])
            return run if run["last_step"] == 120 else None
        run = wait_for(run_of, 30, 0.5, what="the run's step 120 in watch --once")
        assert [p["step"] for p in run["history"]] == list(range(101, 121)) and len(run["log_tail"]) == 20
        assert {"exception_texts", "exceptions", "tok_per_s", "gpus", "phase"} <= set(run)
        run = run_of("--history", "50")
        assert [p["step"] for p in run["history"]] == list(range(71, 121)) and len(run["log_tail"]) == 50
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_watch_once_json_says_why_a_target_without_nvidia_smi_has_no_gpu_samples(inv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.pathsep.join((str(tmp_path), "/usr/bin", "/bin")))  # no nvidia-smi on it
    code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", capsys=capsys)
    assert code == 0, err
    assert snapshot["gpus"] == [] and snapshot["gpu_errors"] == {"local": "nvidia-smi is not installed"}
