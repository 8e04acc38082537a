"""The watch stream's messages (agent -> controller): one frozen dataclass per kind, its codec beside it.

The watch agent builds a message and sends `to_wire()`, one JSON object a line keyed by "t"; the controller
reads each line once where its stream arrives (`decode_message`) and hands the typed message on. The JSON is
what every earlier agent sent: a controller reads the stream of a deployed agent of the last version as it reads
its own, and a message it cannot read (a kind it does not know, a field of the wrong type) is None, never an
error. Log and metrics bytes travel base64-encoded; the codec decodes them.

    {"t": "runs", "runs": [RECORD...]}                      RunsMessage
    {"t": "log", "run": ID, "offset": N, "ino": I, "data": BASE64}   LogMessage
    {"t": "reset", "run": ID, "size": N, "why": truncated|replaced|rewritten}   ResetMessage
    {"t": "metrics", "run": ID, "offset": N, "data": BASE64[, "restart": true]}   MetricsMessage
    {"t": "synced", "runs": [ID...]}                        SyncedMessage
    {"t": "gpu", "csv": TEXT} | {"t": "gpu", "error": TEXT}  GpuMessage
    {"t": "disk", "free_bytes": N, "total_bytes": N}       DiskMessage
    {"t": "hb"}                                             Heartbeat
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .run import RunRecord

MSG_RUNS, MSG_LOG, MSG_RESET, MSG_SYNCED, MSG_GPU, MSG_HEARTBEAT = "runs", "log", "reset", "synced", "gpu", "hb"
MSG_DISK = "disk"  # free space of the filesystem that holds the runs directory
MSG_METRICS = "metrics"  # new whole lines of a followed run's metrics.jsonl
RESET_REASONS = ("truncated", "replaced", "rewritten")


def _count(value: object) -> Optional[int]:
    """A JSON integer (not a bool), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> Optional[bytes]:
    try:
        return base64.b64decode(text or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class RunsMessage:
    """Every run's record, at start and whenever a state.json or the set of runs changes; on the wire each is
    RunRecord's JSON object without its unknown (None) fields, and one without a string run_id is dropped."""

    runs: Tuple[RunRecord, ...] = ()

    def to_wire(self) -> dict:
        return {"t": MSG_RUNS, "runs": [{key: value for key, value in run.to_dict().items() if value is not None}
                                        for run in self.runs]}

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["RunsMessage"]:
        runs = obj.get("runs")
        if not isinstance(runs, list):
            return None
        return cls(tuple(RunRecord.from_dict(run) for run in runs
                         if isinstance(run, dict) and isinstance(run.get("run_id"), str)))


@dataclass(frozen=True)
class LogMessage:
    """New bytes of a followed run's train.log, from byte `offset` of the file whose inode is `ino`."""

    run: str
    offset: int
    data: bytes
    ino: Optional[int] = None

    def to_wire(self) -> dict:
        return {"t": MSG_LOG, "run": self.run, "offset": self.offset, "ino": self.ino, "data": _b64(self.data)}

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["LogMessage"]:
        run, offset, data = obj.get("run"), _count(obj.get("offset")), _unb64(obj.get("data"))
        if not isinstance(run, str) or offset is None or data is None:
            return None
        return cls(run, offset, data, _count(obj.get("ino")))


@dataclass(frozen=True)
class ResetMessage:
    """The bytes before a followed log's offset are no longer what was sent: its new content comes from its
    start (`why`: truncated, replaced or rewritten)."""

    run: str
    size: Optional[int] = None
    why: str = "replaced"

    def to_wire(self) -> dict:
        return {"t": MSG_RESET, "run": self.run, "size": self.size, "why": self.why}

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["ResetMessage"]:
        run, why = obj.get("run"), obj.get("why")
        if not isinstance(run, str):
            return None
        return cls(run, _count(obj.get("size")), why if isinstance(why, str) and why else "replaced")


@dataclass(frozen=True)
class MetricsMessage:
    """New whole lines of a followed run's metrics.jsonl (the trainer's exact step records) from byte `offset`;
    `restart`: the file shrank and is sent again from its start."""

    run: str
    offset: int
    data: bytes
    restart: bool = False

    def to_wire(self) -> dict:
        wire = {"t": MSG_METRICS, "run": self.run, "offset": self.offset, "data": _b64(self.data)}
        if self.restart:
            wire["restart"] = True
        return wire

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["MetricsMessage"]:
        run, offset, data = obj.get("run"), _count(obj.get("offset")), _unb64(obj.get("data"))
        if not isinstance(run, str) or offset is None or data is None:
            return None
        return cls(run, offset, data, obj.get("restart") is True)


@dataclass(frozen=True)
class SyncedMessage:
    """These followed logs (and their metrics) have been sent up to their end."""

    runs: Tuple[str, ...] = ()

    def to_wire(self) -> dict:
        return {"t": MSG_SYNCED, "runs": list(self.runs)}

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["SyncedMessage"]:
        runs = obj.get("runs")
        return cls(tuple(r for r in runs if isinstance(r, str))) if isinstance(runs, list) else None


@dataclass(frozen=True)
class GpuMessage:
    """One sample of the agent's looping nvidia-smi (its CSV rows), or why there is none."""

    csv: str = ""
    error: Optional[str] = None

    def to_wire(self) -> dict:
        return {"t": MSG_GPU, "error": self.error} if self.error is not None else {"t": MSG_GPU, "csv": self.csv}

    @classmethod
    def from_wire(cls, obj: dict) -> "GpuMessage":
        if "error" in obj:
            return cls(error=str(obj["error"]))
        return cls(csv=str(obj.get("csv") or ""))


@dataclass(frozen=True)
class DiskMessage:
    """Free and total bytes of the filesystem the runs are written to."""

    free_bytes: int
    total_bytes: int

    def to_wire(self) -> dict:
        return {"t": MSG_DISK, "free_bytes": self.free_bytes, "total_bytes": self.total_bytes}

    @classmethod
    def from_wire(cls, obj: dict) -> Optional["DiskMessage"]:
        free, total = _count(obj.get("free_bytes")), _count(obj.get("total_bytes"))
        return None if free is None or total is None else cls(free, total)


@dataclass(frozen=True)
class Heartbeat:
    """Sent every heartbeat interval, so that the controller can tell a dead link."""

    def to_wire(self) -> dict:
        return {"t": MSG_HEARTBEAT}

    @classmethod
    def from_wire(cls, obj: dict) -> "Heartbeat":
        return cls()


WatchMessage = Union[RunsMessage, LogMessage, ResetMessage, MetricsMessage, SyncedMessage, GpuMessage, DiskMessage,
                     Heartbeat]
KINDS = {MSG_RUNS: RunsMessage, MSG_LOG: LogMessage, MSG_RESET: ResetMessage, MSG_METRICS: MetricsMessage,
         MSG_SYNCED: SyncedMessage, MSG_GPU: GpuMessage, MSG_DISK: DiskMessage, MSG_HEARTBEAT: Heartbeat}


def decode_message(obj: object):
    """The typed message of one decoded JSON line of the stream; None for anything else (a kind this version
    does not know, a message whose fields are not what its kind has)."""
    if not isinstance(obj, dict):
        return None
    kind = obj.get("t")
    decoder = KINDS.get(kind) if isinstance(kind, str) else None
    return None if decoder is None else decoder.from_wire(obj)
