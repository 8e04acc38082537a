"""The watch stream's typed messages: a controller of this version reads the lines a deployed agent of the last
version sends (recorded below as it wrote them), the new agent writes the same JSON, and what is not a message of
a known kind is left out, never an error."""
from __future__ import annotations

import base64
import json

from dflash_records.run import RunRecord
from dflash_records.step import StepRecord
from dflash_records.watchwire import (DiskMessage, GpuMessage, Heartbeat, LogMessage, MetricsMessage, ResetMessage,
                                      RunsMessage, SyncedMessage, decode_message)

STEP = StepRecord(elapsed_s=70.0, step=7, loss=2.71828, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
                  tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=350.4, q_pre=(1,), q_hs=(), epoch=0.0,
                  eta_s=60.0)
LOG = ("Loading dataset from /data...\n" + STEP.to_line() + "\n").encode()
METRICS = (STEP.to_json() + "\n").encode()
RECORD = {"run_id": "r-1", "target": "local", "name": "exact", "state": "running", "pid": 42,
          "log_path": "/w/.dflash/runs/r-1/train.log"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# The lines of agent 0.1.0's `watch` (before the messages were typed), as it wrote them: compact JSON, one a line.
OLD_AGENT_LINES = [
    '{"t":"disk","free_bytes":1000000,"total_bytes":5000000}',
    '{"t":"runs","runs":[' + json.dumps(RECORD, separators=(",", ":")) + ']}',
    '{"t":"gpu","csv":"0, GPU-1, NVIDIA H100, 1024, 81559, 97"}',
    '{"t":"metrics","run":"r-1","offset":0,"data":"' + b64(METRICS) + '"}',
    '{"t":"log","run":"r-1","offset":0,"ino":1234,"data":"' + b64(LOG) + '"}',
    '{"t":"synced","runs":["r-1"]}',
    '{"t":"hb"}',
]


def test_each_line_of_the_last_versions_agent_reads_as_its_typed_message_and_writes_back_the_same():
    messages = [decode_message(json.loads(line)) for line in OLD_AGENT_LINES]
    assert [type(m) for m in messages] == [DiskMessage, RunsMessage, GpuMessage, MetricsMessage, LogMessage,
                                           SyncedMessage, Heartbeat]
    disk, runs, gpu, metrics, log, synced, _ = messages
    assert (disk.free_bytes, disk.total_bytes) == (1000000, 5000000) and runs.runs == (RunRecord.from_dict(RECORD),)
    assert gpu.csv.startswith("0, GPU-1") and gpu.error is None
    assert (metrics.run, metrics.offset, metrics.data, metrics.restart) == ("r-1", 0, METRICS, False)
    assert (log.run, log.offset, log.ino, log.data) == ("r-1", 0, 1234, LOG) and synced.runs == ("r-1",)
    for line, message in zip(OLD_AGENT_LINES, messages):  # the new agent sends what the old one did
        assert message.to_wire() == json.loads(line)
    for old in ('{"t":"reset","run":"r-1","size":10,"why":"truncated"}', '{"t":"gpu","error":"nvidia-smi exited 9"}',
                '{"t":"metrics","run":"r-1","offset":5,"data":"","restart":true}'):
        assert decode_message(json.loads(old)).to_wire() == json.loads(old)
    assert decode_message(json.loads(OLD_AGENT_LINES[0])) == DiskMessage(1000000, 5000000)
    assert ResetMessage("r-1", 10, "rewritten").to_wire()["why"] == "rewritten"


def test_what_is_not_a_message_of_a_known_kind_reads_as_none():
    for obj in ([1], "hb", {"t": "steps", "run": "r-1"}, {"t": ["log"]}, {"t": "log", "run": "r-1", "offset": "0",
                "data": ""}, {"t": "log", "run": "r-1", "offset": 0, "data": "not base64!"},
                {"t": "metrics", "run": 7, "offset": 0, "data": ""}, {"t": "disk", "free_bytes": True,
                                                                     "total_bytes": 1}, {"t": "runs", "runs": {}}):
        assert decode_message(obj) is None, obj
    runs = decode_message({"t": "runs", "runs": [RECORD, {"run_id": 3}, "r-2"]})
    assert runs.runs == (RunRecord.from_dict(RECORD),)  # the records without a run id are dropped where the line is read
