"""How a run's fields read in the runs table: short, aligned, coloured by meaning."""
from __future__ import annotations

import math

from rich.text import Text

from orchestrator.watchmodel import RunView

TERMINAL_STATES = frozenset({"succeeded", "failed", "killed", "lost"})
STATE_STYLES = {
    "starting": "cyan",
    "running": "green",
    "succeeded": "blue",
    "failed": "bold red",
    "killed": "magenta",
    "lost": "yellow",
}
# (column key, header); the keys are what RunsTable updates cells by.
COLUMNS = (
    ("target", "target"),
    ("run", "run"),
    ("state", "state"),
    ("phase", "phase"),
    ("step", "step"),
    ("loss", "loss"),
    ("acc", "acc"),
    ("streak", "streak"),
    ("lr", "lr"),
    ("tok_s", "tok/s"),
    ("eta", "ETA"),
    ("exceptions", "exc"),
)
MISSING = "-"
MAX_NAME_CHARS = 24
ENDED = frozenset({"succeeded", "failed", "killed", "lost"})


def run_cells(run: RunView) -> dict[str, Text]:
    """The table cells of one run, by column key."""
    return {
        "target": Text(run.target),
        "run": Text(_shorten(run.name or run.run_id, MAX_NAME_CHARS)),
        "state": Text(run.state, style=STATE_STYLES.get(run.state, "")),
        "phase": Text(run.phase or MISSING),
        "step": _number(MISSING if run.last_step is None else str(run.last_step)),
        "loss": _number(format_float(run.loss, 4), bad=not _finite(run.loss)),
        "acc": _number(format_float(run.acc, 3)),
        "streak": _number(format_float(run.streak, 2)),
        "lr": _number(MISSING if run.lr is None else f"{run.lr:.2e}"),
        "tok_s": _number(format_rate(run.tok_per_s)),
        # an ended run has nothing left to wait for, whatever its last step line promised
        "eta": _number(MISSING if run.state in ENDED else format_duration(run.eta_s)),
        "exceptions": _number(str(run.exceptions), bad=run.exceptions > 0),
    }


def format_float(value: float | None, digits: int) -> str:
    if value is None:
        return MISSING
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}f}"


def format_rate(per_s: float | None) -> str:
    """Tokens per second the way the trainer logs them (11.7K)."""
    if per_s is None or not math.isfinite(per_s):
        return MISSING
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(per_s) >= divisor:
            return f"{per_s / divisor:.1f}{suffix}"
    return f"{per_s:.0f}"


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return MISSING
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.0f}s"


def run_label(run: RunView) -> str:
    """How a run is named in prompts: its name, and its id when that differs."""
    if run.name and run.name != run.run_id:
        return f"{run.name} ({run.run_id})"
    return run.run_id


def _number(text: str, *, bad: bool = False) -> Text:
    return Text(text, style="bold red" if bad else "", justify="right")


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
