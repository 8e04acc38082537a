"""A sweep's run records its sweep in run.json (`launch --sweep-id --sweep-values`), and ps gives it back."""
from __future__ import annotations

import json

import pytest

from dflash_agent.errors import BadInput
from dflash_agent.launch import sweep_fields
from tests.dflash_agent.pidns import launch, record


def test_a_sweep_run_records_its_sweep_and_values_in_run_json(container, runs_dir):
    values = {"lr": 0.0003, "loss": "ce", "compile": True}
    code, answer = launch(container, runs_dir, "sw-1", ["sleep", "30"], "--sweep-id", "sweep-lr-abc123",
                          "--sweep-values", json.dumps(values))
    assert code == 0, answer
    with open(f"{runs_dir}/sw-1/run.json") as handle:
        run_json = json.load(handle)
    assert (run_json["sweep_id"], run_json["sweep_values"]) == ("sweep-lr-abc123", values)
    listed = record(container, runs_dir, "sw-1")
    assert (listed["sweep_id"], listed["sweep_values"]) == ("sweep-lr-abc123", values)
    container.agent("kill", "--runs-dir", runs_dir, "--run-id", "sw-1", "--grace", "1")


@pytest.mark.parametrize("sweep_id, values", [(None, "{}"), ("bad id", "{}"), ("s", "[1]"), ("s", "{\"a\": [1]}"),
                                              ("s", "not json"), ("s", json.dumps({"k": "x" * 5000}))])
def test_bad_sweep_fields_are_refused(sweep_id, values):
    with pytest.raises(BadInput):
        sweep_fields(sweep_id, values)
    assert sweep_fields(None, None) == {"sweep_id": None, "sweep_values": None}
