"""How values read wherever a person sees them: state colours, durations, ages, token rates.

`ps`, the alerts' messages and the dashboard all take them from here, so a state has one colour and a
duration one spelling everywhere. Pure functions of their arguments; the colours are rich style strings.
"""
from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence

from rich.cells import cell_len
from rich.text import Text

from dflash_records.protocol import FAILED, GIB, KILLED, LOST, MIB, QUEUED, RUNNING, STARTING, SUCCEEDED
from dflash_records.queueinfo import ordinal
from dflash_records.restart import BACKOFF_KILLED, CRASH_LOOP, HUNG
from dflash_records.run import RunRecord
from dflash_records.step import StepRecord, format_eta


MISSING = "-"
STATE_STYLES = {
    QUEUED: "dim cyan",
    STARTING: "cyan",
    RUNNING: "green",
    SUCCEEDED: "blue",
    FAILED: "bold red",
    KILLED: "magenta",
    LOST: "yellow",
}
UNKNOWN_STATE_STYLE = "white"
# why the supervisor ended a run (the record's `reason`), shown beside its state; any other value is not shown
SHOWN_REASONS = (HUNG, CRASH_LOOP, BACKOFF_KILLED)


def state_style(state: str | None) -> str:
    return STATE_STYLES.get(state or "", UNKNOWN_STATE_STYLE)


def state_text(state: str | None, *, attempt: int | None = None, max_attempts: int | None = None,
               restarting: bool = False, reason: str | None = None, position: int | None = None) -> str:
    """A run's state as ps and the dashboard show it: `queued (2nd)` while it waits in its container's queue
    (`position` 2), `running (attempt 3/5)` under a restart policy, `running (restarting: attempt 2/5 next)` in
    the backoff between two attempts; why the supervisor ended it, where it says: `failed (hung)`, `failed (crash
    loop, attempt 3/5)`, `killed during the backoff`."""
    if state == QUEUED:
        return f"{QUEUED} ({ordinal(position)})" if isinstance(position, int) and position > 0 else QUEUED
    text, notes = state or MISSING, []
    if reason in SHOWN_REASONS and state in (FAILED, KILLED):
        if reason.startswith(f"{text} "):
            text = reason
        else:
            notes.append(reason)
    if isinstance(attempt, int) and isinstance(max_attempts, int) and max_attempts > 1:
        if restarting and state == RUNNING:
            return f"{text} (restarting: attempt {attempt + 1}/{max_attempts} next)"
        if attempt > 1 or state == RUNNING:
            notes.append(f"attempt {attempt}/{max_attempts}")
    return f"{text} ({', '.join(notes)})" if notes else text


def record_state_text(record: RunRecord) -> str:
    return state_text(record.state, attempt=record.attempt, max_attempts=record.max_attempts,
                      restarting=bool(record.restart_at), reason=record.reason, position=record.queue_position)


def waiting_for(gpus: Sequence[int] | None, gpu_count: int | None) -> str:
    """What a queued run waits for: `2 GPUs` (--gpu-count: any two), `GPU 1`, `GPUs 0-3` (--gpus), `every GPU`
    (neither: it holds them all), `its turn` (--gpus none: it needs none, and waits only for the runs ahead)."""
    if gpu_count is not None:
        return f"{gpu_count} GPU{'' if gpu_count == 1 else 's'}"
    if gpus is None:
        return "every GPU"
    if not gpus:
        return "its turn"
    return f"GPU{'' if len(gpus) == 1 else 's'} {index_ranges(gpus)}"


def index_ranges(indices: Iterable[int]) -> str:
    """[0, 1, 2, 3, 4, 6] -> `0-4,6`."""
    ordered = sorted(set(indices))
    spans: list[str] = []
    start = prev = ordered[0]
    for index in ordered[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(spans)


def format_duration(seconds: float | None) -> str:
    """`42s`, `3m07s`, `2h05m`, `1.5d`; MISSING for nothing, a negative or a non-finite value."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return MISSING
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.0f}s"


def format_age(seconds: float | None) -> str:
    """An age in its largest whole unit (`3d`, `5h`, `12m`, `40s`): a column to scan, not to read exactly."""
    if seconds is None:
        return MISSING
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def parse_stamp(text: str) -> datetime.datetime:
    """A record's time stamp (ISO 8601, `Z` or an offset); now where it cannot be read, so an age is never wrong
    by decades."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.now(datetime.timezone.utc)


def age(stamp: str | None, now: datetime.datetime) -> str:
    """How long ago a record's time stamp was, as format_age says it (`3m`); MISSING without one."""
    if not stamp:
        return MISSING
    return format_age((now - parse_stamp(stamp)).total_seconds())


def format_rate(per_s: float | None) -> str:
    """Tokens per second the way the trainer logs them (11.7K)."""
    if per_s is None or not math.isfinite(per_s):
        return MISSING
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(per_s) >= divisor:
            return f"{per_s / divisor:.1f}{suffix}"
    return f"{per_s:.0f}"


def step_figures(step: StepRecord) -> str:
    """A step's figures on one line, as a notification quotes them: `step 8: loss 12.5546, acc 0.025, 350 tok/s,
    ETA 12.0d` (what the record has; from metrics.jsonl where it exists, so exact where the log line rounds)."""
    parts = [f"{label} {fmt.format(value)}" for label, value, fmt in (
        ("loss", step.loss, "{:.4f}"), ("acc", step.acc, "{:.3f}")) if value is not None]
    if step.tok_per_s is not None:
        parts.append(f"{format_rate(step.tok_per_s)} tok/s")
    if step.eta_s is not None:
        parts.append(f"ETA {format_eta(step.eta_s)}")
    return f"step {step.step}" + (": " + ", ".join(parts) if parts else "")


def format_gib(mib: float | None, decimals: int = 1) -> str:
    """nvidia-smi's MiB as a bare GiB figure (`67.5`), for columns that say the unit once."""
    return MISSING if mib is None else f"{mib * MIB / GIB:.{decimals}f}"


def format_bytes(size: float | None) -> str:
    """Bytes as a person reads them: 0 B, 296 KiB, 1.2 GiB."""
    if size is None:
        return MISSING
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit in ("B", "KiB") or value >= 100 else f"{value:.1f} {unit}"


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and `…` when it is longer than `limit`."""
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + "…"


def widest_cells(headers: Mapping[str, str], rows: Iterable[Mapping[str, Text]]) -> dict[str, int]:
    """Cells the widest value (or header) of each column takes on screen, by column key (the headers' columns)."""
    widths = {key: cell_len(header) for key, header in headers.items()}
    for row in rows:
        for key in widths:
            widths[key] = max(widths[key], row[key].cell_len)
    return widths


def fit_columns(widths: Mapping[str, int], *, width: int, gap: int,
                drop: Sequence[Sequence[str]] = ()) -> tuple[str, ...] | None:
    """The columns (keys of `widths`, in its order) that fit side by side in `width` cells, each taking its
    width and `gap`: all of them, else all but the first group of `drop`, else all but the first two groups, and
    so on; None when not even the last choice fits. What a table shows at a terminal's width: a column is left
    out whole, never cut (`ps`, the dashboard's runs table)."""
    kept = list(widths)
    for group in ((), *drop):
        kept = [key for key in kept if key not in group]
        if sum(widths[key] + gap for key in kept) <= width:
            return tuple(kept)
    return None
