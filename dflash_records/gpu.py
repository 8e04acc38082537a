"""A GPU as nvidia-smi shows it: GpuRow, the one row the agent produces and the controller, watch and the
dashboard read, with its codecs (nvidia-smi's CSV rows, the wire's JSON object); the nvidia-smi query that
gives it; and when a GPU counts as held (and as idle while held).

Only per-GPU numbers: inside LXC nvidia-smi's process list is empty or shows host PIDs, so nothing here ever
matches its PIDs to processes.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .digits import ascii_decimal

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
GPU_MEMORY_FIELDS = ("index", "memory.used", "utilization.gpu")  # what cleanup needs (and old drivers all have)
# An idle GPU shows a few hundred MiB at most (driver, a stray context); a model or a leaked run holds GiBs.
GPU_HELD_MIB = 1024
# nvidia-smi's utilisation is whole percent over its last sample period: 0 is a GPU doing nothing at all, while
# even a run starved of data shows a few percent
GPU_IDLE_UTIL_PCT = 0.0
# nvidia-smi's query field -> the row's field (memory in MiB, utilisation in %)
FIELD_KEYS = {"index": "index", "uuid": "uuid", "name": "name", "memory.used": "memory_used_mib",
              "memory.total": "memory_total_mib", "utilization.gpu": "utilization_pct"}
# what nvidia-smi prints for a value it cannot give (a MIG slice, an old driver, a fallen-off GPU)
NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}


def idle_and_held(memory_used_mib, utilization_pct, *, held_mib: float = GPU_HELD_MIB,
                  idle_pct: float = GPU_IDLE_UTIL_PCT) -> bool:
    """A GPU holding memory while doing nothing: a stalled or leaked run (the seed run sat like this for hours),
    what watch alerts on and the dashboard marks. A value nvidia-smi did not give proves nothing."""
    return (memory_used_mib is not None and memory_used_mib >= held_mib
            and utilization_pct is not None and utilization_pct <= idle_pct)


def gpu_query_args(fields: tuple = GPU_FIELDS) -> list:
    """nvidia-smi's arguments for one CSV row per GPU with `fields`, no header, no units."""
    return ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class GpuRow:
    """One GPU of one sample; a value nvidia-smi could not give (or was not asked for) is None."""
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None

    @property
    def held(self) -> bool:
        """Holding memory (GPU_HELD_MIB or more): a model, or a leaked run."""
        return (self.memory_used_mib or 0) >= GPU_HELD_MIB

    @property
    def idle_and_held(self) -> bool:
        """Holding memory while doing nothing (the rule watch alerts on, at its default thresholds)."""
        return idle_and_held(self.memory_used_mib, self.utilization_pct)

    def to_dict(self, query: tuple = GPU_FIELDS) -> dict:
        """The row on the wire and in `--json`: the fields of the nvidia-smi query it was read with (all of them
        unless said), None where unknown."""
        return {FIELD_KEYS[field]: getattr(self, FIELD_KEYS[field]) for field in query if field in FIELD_KEYS}

    @classmethod
    def from_dict(cls, data) -> GpuRow | None:
        """The row of a JSON object; None when it names no GPU (no whole-number index). Keys it does not know
        are left out."""
        index = data.get("index") if isinstance(data, dict) else None
        if isinstance(index, bool) or not isinstance(index, int):
            return None
        return cls(**{name: data[name] for name in GPU_ROW_KEYS if name in data})


GPU_ROW_KEYS = tuple(f.name for f in fields(GpuRow))


def parse_query_csv(text: str, fields: tuple = GPU_FIELDS) -> list:
    """The GpuRows of `--query-gpu=<fields> --format=csv[,noheader][,nounits]` (fields it has no home for are
    left out); a value nvidia-smi cannot give is None. A header, a blank line or a line cut short is skipped;
    units are tolerated."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields) or ascii_decimal(cells[0]) is None:
            continue
        values = {FIELD_KEYS[field]: _value(field, cell) for field, cell in zip(fields, cells) if field in FIELD_KEYS}
        values["index"] = ascii_decimal(cells[0])
        rows.append(GpuRow(**values))
    return rows


def _value(field: str, cell: str):
    if cell in NOT_AVAILABLE:
        return None
    if field in ("uuid", "name"):
        return cell
    try:
        number = float(cell.split()[0])  # "88283 MiB" -> 88283, "0 %" -> 0
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def held_without_run(rows: list, live_gpu_sets: list) -> list:
    """The rows of GPUs holding memory that no live run accounts for (a live run without --gpus may use any GPU:
    then none)."""
    if any(s is None for s in live_gpu_sets):
        return []
    claimed = set()
    for gpu_set in live_gpu_sets:
        claimed.update(gpu_set)
    return [row for row in rows if row.held and row.index not in claimed]
