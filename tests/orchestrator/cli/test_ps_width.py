"""`ps` at a terminal's width: the columns that fit are shown whole, the others left out; a number is never cut
(it used to print `8…` for a step of 812345 at 80 columns) and no line is wider than the terminal."""
from __future__ import annotations

import time

import pytest

from dflash_records.step import StepRecord
from orchestrator.display import format_rate
from tests.lab.workloads import run_cli

WIDTHS = (80, 100, 120, 200)
ALL = ("RUN", "TARGET", "NAME", "STATE", "PID", "AGE", "EXIT", "STEP", "TOK/S")


def step_line(step: int) -> str:
    return StepRecord(
        elapsed_s=60.0 * step, step=step, loss=3.0, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
        tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=11734.0, q_pre=[1], q_hs=[], epoch=0.0,
        eta_s=60.0).to_line()


@pytest.fixture
def runs(inv, capsys):
    """A live training-like run far into its steps, one that succeeded and one that failed; their records."""
    launches = [("a-long-training-run-name", ["sh", "-c", 'printf "%s\\n" "$1"; sleep 60', "sh", step_line(812345)]),
                ("done", ["sh", "-c", "sleep 1.5"]), ("broke", ["sh", "-c", "sleep 1.5; exit 3"])]
    ids = []
    for name, argv in launches:
        code, record, err = run_cli(inv, "launch", "local", "--json", "--gpus", "none", "--name", name, "--", *argv,
                                    capsys=capsys)
        assert code == 0, err
        ids.append(record["run_id"])
    deadline = time.monotonic() + 60
    while True:
        code, listing, err = run_cli(inv, "ps", "--json", capsys=capsys)
        records = {r["run_id"]: r for r in listing["runs"]}
        if [records[i]["state"] for i in ids] == ["running", "succeeded", "failed"] and records[ids[0]]["last_step"]:
            break
        assert time.monotonic() < deadline, (listing, err)
        time.sleep(0.2)
    yield [records[i] for i in ids]
    run_cli(inv, "kill", ids[0], "--grace", "1", capsys=capsys)


@pytest.mark.parametrize("width", WIDTHS)
def test_ps_shows_whole_columns_that_fit_the_terminal(inv, capsys, monkeypatch, runs, width):
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = run_cli(inv, "ps", capsys=capsys)
    assert code == 0, err
    lines = [line.rstrip() for line in out.splitlines() if line.strip()]
    assert all(len(line) <= width for line in lines), (width, out)
    assert "…" not in out, out
    header, rows = lines[0].split(), [line.split() for line in lines[1:]]
    assert {"RUN", "STATE", "STEP"} <= set(header), header  # what a person scans for stays at 80 columns
    if width >= 120:  # the name goes first (the run id starts with it)
        assert [column for column in ALL if column != "NAME"] == [column for column in header if column != "NAME"]
    if width == 200:
        assert header == list(ALL)
    by_id = {row[0]: dict(zip(header, row)) for row in rows}
    assert sorted(by_id) == sorted(r["run_id"] for r in runs), out  # every id whole, every row one cell a column
    for record in runs:
        cells = by_id[record["run_id"]]
        expected = {"PID": str(record["pid"] or "-"), "STEP": str(record["last_step"] or "-"),
                    "EXIT": "-" if record["exit_code"] is None else str(record["exit_code"]),
                    "TOK/S": format_rate(record["tok_per_s"]), "STATE": record["state"]}
        for column, value in expected.items():
            assert cells.get(column, value) == value, (width, column, cells, record)
        if "AGE" in cells:
            assert cells["AGE"][:-1].isascii() and cells["AGE"][:-1].isdigit() and cells["AGE"][-1] in "smhd"
    assert by_id[runs[0]["run_id"]]["STEP"] == "812345"


def test_ps_never_cuts_a_run_id_on_a_narrow_terminal(inv, capsys, monkeypatch, runs):
    """Below what RUN, STATE and STEP take, STEP is left out and STATE cut short; the id stays whole, even on a
    terminal narrower than it and STATE's header (the line is longer then, and the terminal wraps it)."""
    longest = max(len(r["run_id"]) for r in runs)
    for width in (longest + 12, longest + 9, 30):
        monkeypatch.setenv("COLUMNS", str(width))
        code, out, err = run_cli(inv, "ps", capsys=capsys)
        assert code == 0, err
        lines = [line.rstrip() for line in out.splitlines() if line.strip()]
        assert lines[0].split()[:2] == ["RUN", "STATE"], (width, out)
        assert sorted(line.split()[0] for line in lines[1:]) == sorted(r["run_id"] for r in runs), (width, out)
        if width >= longest + 9:  # room for the id and a cut STATE: no line is wider than the terminal
            assert all(len(line) <= width for line in lines), (width, out)
        states = {r["run_id"]: r["state"] for r in runs}
        for run_id, state in (line.split()[:2] for line in lines[1:]):
            assert state.rstrip("…") and states[run_id].startswith(state.rstrip("…")), (width, out)


def test_fit_columns_leaves_whole_columns_out_in_the_order_given():
    from orchestrator.display import fit_columns

    widths = {"run": 20, "name": 10, "pid": 6, "step": 6}
    assert fit_columns(widths, width=50, gap=2) == ("run", "name", "pid", "step")
    assert fit_columns(widths, width=49, gap=2, drop=[("name",), ("pid",)]) == ("run", "pid", "step")
    assert fit_columns(widths, width=30, gap=2, drop=[("name",), ("pid",)]) == ("run", "step")
    assert fit_columns(widths, width=29, gap=2, drop=[("name",), ("pid",)]) is None


def test_ps_says_under_the_table_why_a_run_failed_to_start(inv, capsys, monkeypatch):
    """EXIT says 127; the note under the table says what the agent said of it."""
    monkeypatch.setenv("COLUMNS", "120")
    code, _, err = run_cli(inv, "launch", "local", "--gpus", "none", "--name", "typo", "--", "no-such-command-xyz",
                           capsys=capsys)
    assert code == 1 and "command not found" in err, err
    code, out, err = run_cli(inv, "ps", capsys=capsys)
    assert code == 0, err
    [note] = [line for line in out.splitlines() if line.startswith("typo-") and "command not found" in line]
    assert note.endswith(": failed, exit code 127: command not found: no-such-command-xyz"), out
