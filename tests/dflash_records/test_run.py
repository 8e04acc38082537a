"""The run record: the agent builds it from run.json and state.json, the controller reads it typed, and a key
this version does not know (a newer agent's) survives the round trip."""
from __future__ import annotations

from dflash_records.run import RECORD_KEYS, RUN_JSON_FIELDS, STATE_JSON_FIELDS, RunRecord
from dflash_agent.rundir import RunPaths
from dflash_agent.runstate import build_record


def test_the_agents_record_is_the_run_records_fields_and_reads_back(tmp_path):
    paths = RunPaths(str(tmp_path), "r-1")
    run = {"run_id": "r-1", "target": "local", "name": "r", "gpus": [0, 1], "created_at": "2026-01-01T00:00:00Z",
           "env": {"SECRET": "x"}}
    state = {"state": "failed", "pid": 42, "exit_code": 3, "attempts": [{"attempt": 1}]}
    wire = build_record(paths, run, state)
    assert set(wire) == set(RECORD_KEYS) - {"last_step", "tok_per_s"}  # those two the controller reads from the log
    record = RunRecord.from_dict(wire)
    assert (record.run_id, record.state, record.exit_code, record.gpus, record.log_path) == \
        ("r-1", "failed", 3, [0, 1], paths.log)
    assert record.to_dict() == {**wire, "last_step": None, "tok_per_s": None}


def test_unknown_keys_are_kept_and_garbage_gives_an_empty_record():
    record = RunRecord.from_dict({"run_id": "r-2", "state": "running", "from_a_newer_agent": 1})
    assert record.to_dict()["from_a_newer_agent"] == 1 and record.state == "running"
    assert RunRecord.from_dict(None) == RunRecord() and RunRecord.from_dict({"run_id": 7}).run_id == ""


def test_the_files_split_the_fields_between_them():
    assert RUN_JSON_FIELDS[0] == "run_id" and "created_at" in RUN_JSON_FIELDS and "job_id" in RUN_JSON_FIELDS
    assert STATE_JSON_FIELDS[0] == "state" and "attempts" in STATE_JSON_FIELDS and "log_path" not in STATE_JSON_FIELDS
