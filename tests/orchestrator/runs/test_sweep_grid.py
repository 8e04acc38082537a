"""The sweep's grid and its report's rows, without any target: --set parsing, the cartesian product over the
config (dotted keys, each run's output directory), the ranking by newest held-out τ, the values that differ."""
from __future__ import annotations

import json

import pytest

from dflash_records.run import RunRecord
from dflash_records.step import StepRecord
from orchestrator.errors import UsageError
from orchestrator.runs.sweep import SweepNames, check_size, grid, parse_sets, parse_value, rank_key
from orchestrator.runs.sweepreport import differing_keys, markdown, ranked, sweep_row, table_rows
from orchestrator.runs.trainerconfig import unknown_key

BASE = {"target_path": "t", "data_path": "d", "output_dir": "out", "lr": 6e-4, "loss": "ce"}


@pytest.mark.parametrize("text, value", [("1e-4", 1e-4), ("3", 3), ("0.5", 0.5), ("ce+dpace", "ce+dpace"),
                                         ("true", True), ("null", None), ("[1", "[1")])
def test_values_are_yaml_scalars_and_every_number_is_one(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_the_grid_is_the_cartesian_product_with_the_last_key_fastest_and_a_directory_per_run():
    axes = parse_sets(["lr=1e-4,3e-4", "slot_weights=decay,dpace", "seed=7"], unknown_key)
    names = SweepNames("lrs", "abc123")
    points = grid(BASE, axes, run_name=names.run_name)
    assert [p.values for p in points] == [
        {"lr": 1e-4, "slot_weights": "decay", "seed": 7}, {"lr": 1e-4, "slot_weights": "dpace", "seed": 7},
        {"lr": 3e-4, "slot_weights": "decay", "seed": 7}, {"lr": 3e-4, "slot_weights": "dpace", "seed": 7}]
    assert [p.config["output_dir"] for p in points] == [f"out/lrs-abc123-{i}" for i in (1, 2, 3, 4)]
    assert points[3].config == {**BASE, "lr": 3e-4, "slot_weights": "dpace", "seed": 7, "output_dir": "out/lrs-abc123-4"}
    assert BASE["output_dir"] == "out"  # the base config is left alone
    assert names.sweep_id == "sweep-lrs-abc123" and points[0].label() == "lr=0.0001, slot_weights=decay, seed=7"


def test_a_dotted_key_sets_a_nested_one():
    points = grid(BASE, parse_sets(["loss.ce=0.1,0.5", "loss.cap=1"], unknown_key), run_name=str)
    assert [p.config["loss"] for p in points] == [{"ce": 0.1, "cap": 1}, {"ce": 0.5, "cap": 1}]


@pytest.mark.parametrize("sets, said", [
    (["lr="], "give lr one or more values"), (["lr=1,,2"], "none empty"), (["lr"], "use KEY=V1,V2"),
    (["=1"], "use KEY=V1,V2"), (["objective=ce,ce+dpace"], "unknown config key 'objective' (did you mean 'loss'?)"),
    (["lr=1", "lr=2"], "lr is set twice"), (["lr=1,1.0"], "a value is given twice"), (["lr..x=1"], "not a config key"),
    ([], "no --set"),
])
def test_bad_sets_are_usage_errors_that_name_them(sets, said):
    with pytest.raises(UsageError, match=None) as caught:
        parse_sets(sets, unknown_key)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_grid_past_256_runs_needs_yes():
    axes = parse_sets(["seed=" + ",".join(map(str, range(16))), "max_steps=" + ",".join(map(str, range(1, 18)))],
                      unknown_key)
    with pytest.raises(UsageError, match=r"272 runs \(16 x 17\), more than 256"):
        check_size(axes, yes=False)
    assert check_size(axes, yes=True) == 272
    assert check_size(parse_sets(["seed=" + ",".join(map(str, range(256)))], unknown_key), yes=False) == 256


def _step_line(step: int, tok: float, tau: float | None = None) -> str:
    record = StepRecord(elapsed_s=float(step), step=step, loss=1.0, acc=0.5, streak=1.0, lr=1e-3, noise=0.0, tgt_batches_per_s=1.0,
                        dft_batches_per_s=1.0, tok_per_s=tok, q_pre=(1,), q_hs=(1,), epoch=0.1, eta_s=10.0,
                        tau_heldout=tau, tau_tree_heldout=((8, tau + 1),) if tau else None)
    return record.to_line()


def test_a_row_keeps_the_newest_heldout_tau_though_the_last_step_has_none():
    log = "\n".join([_step_line(2, 900.0, 1.5), _step_line(4, 950.0, 1.75), _step_line(5, 1000.0)]) + "\n"
    metrics = StepRecord(step=5, tok_per_s=1003.5).to_json() + "\n"
    row = sweep_row(RunRecord(run_id="r"), log, metrics)
    assert (row.last_step, row.tok_per_s, row.tau_heldout, row.tau_tree_heldout) == (5, 1003.5, 1.75, ((8, 2.75),))
    assert sweep_row(RunRecord(run_id="r", last_step=3), None, None).tau_heldout is None


def test_runs_rank_by_tau_then_tok_s_and_the_table_shows_only_the_values_that_differ():
    def row(run_id, lr, tau, tok):
        record = RunRecord(run_id=run_id, state="running", sweep_values={"lr": lr, "seed": 0})
        log = _step_line(4, tok, tau) + "\n" if tau or tok else None
        return sweep_row(record, log, None)

    rows = ranked([row("a", 1e-4, 1.5, 900.0), row("b", 3e-4, 2.0, 800.0), row("c", 1e-3, 2.0, 950.0),
                   row("d", 3e-3, None, None)])
    assert [r.run.run_id for r in rows] == ["c", "b", "a", "d"]
    assert rank_key(None, 5.0, "x") > rank_key(1.0, None, "y")
    keys = differing_keys(rows)
    assert keys == ["lr"]
    header, cells = table_rows(rows, keys)
    assert header[:3] == ["#", "RUN", "lr"] and cells[0][:3] == ["1", "c", "0.001"] and cells[0][6] == "8:3.00"
    assert markdown(header, cells).splitlines()[2].startswith("| 1 | c | 0.001 | running | 4 | 2.000 |")
    assert json.dumps(rows[0].to_dict(keys))  # plain JSON
