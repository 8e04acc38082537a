"""How a run's fields read in the runs table: short, aligned, coloured by meaning."""
from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

from dflash_records.protocol import TERMINAL_STATES
from orchestrator.display import MISSING, clip, format_duration, format_rate, state_style, state_text, widest_cells
from orchestrator.watch.model import RunView

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
    ("tau", "τ"),
    ("lr", "lr"),
    ("tok_s", "tok/s"),
    ("eta", "ETA"),
    ("exceptions", "exc"),
)
# What a narrow terminal keeps: what a person scans for (is it alive, is it learning, how fast, any errors).
NARROW_COLUMNS = ("target", "run", "state", "step", "loss", "tok_s", "eta", "exceptions")
MAX_NAME_CHARS = 24
NARROW_NAME_CHARS = 17
NARROW_TARGET_CHARS = 10
ID_SUFFIX_CHARS = 4  # a run id ends in 4 random hex digits: `ticker-261201-120000-3f2a`


def columns(*, narrow: bool = False, tau: bool = True) -> tuple[tuple[str, str], ...]:
    """The narrow or the full columns; the full ones without τ when `tau` is false (no run has one, or the
    terminal has no room for it: it goes before the run names are cut below NARROW_NAME_CHARS)."""
    if narrow:
        return tuple(column for column in COLUMNS if column[0] in NARROW_COLUMNS)
    return COLUMNS if tau else tuple(column for column in COLUMNS if column[0] != "tau")


def widest_run_cells(runs: Sequence[RunView]) -> dict[str, int]:
    """Cells the widest value (or header) of each full-table column takes, by column key."""
    return widest_cells(dict(COLUMNS), (run_cells(run) for run in runs))


def run_names(runs: Sequence[RunView], *, limit: int = MAX_NAME_CHARS) -> dict[str, str]:
    """The run column of every run, by run id: its name, and where several runs share a name, the end of each
    one's id after it (`ticker·3f2a`), as long as needed to tell them apart."""
    by_name: dict[str, list[str]] = {}
    for run in runs:
        by_name.setdefault(run.name or run.run_id, []).append(run.run_id)
    shown: dict[str, str] = {}
    for name, run_ids in by_name.items():
        if len(set(run_ids)) == 1:
            shown[run_ids[0]] = clip(name, limit)
            continue
        width = ID_SUFFIX_CHARS
        while len({run_id[-width:] for run_id in run_ids}) < len(set(run_ids)) and width < max(map(len, run_ids)):
            width += 1
        for run_id in run_ids:
            suffix = run_id[-width:]
            shown[run_id] = f"{clip(name, max(limit - len(suffix) - 1, 1))}·{suffix}"
    return shown


def newest_run(runs: Sequence[RunView]) -> RunView | None:
    """The run to look at first: the newest still going, else the newest of all (ids sort by launch time)."""
    live = [run for run in runs if run.state not in TERMINAL_STATES]
    return max(live or runs, key=lambda run: (run.created_at or "", run.run_id), default=None)


def run_cells(run: RunView, *, name: str | None = None, narrow: bool = False) -> dict[str, Text]:
    """The table cells of one run, by column key; `name` is its run column when names repeat (run_names)."""
    limit = NARROW_NAME_CHARS if narrow else MAX_NAME_CHARS
    return {
        "target": Text(clip(run.target, NARROW_TARGET_CHARS) if narrow else run.target),
        "run": Text((f"#{run.sweep_rank} " if run.sweep_rank else "")  # its rank in its sweep
                    + (name if name is not None else clip(run.name or run.run_id, limit))),
        "state": Text(state_text(run.state, attempt=run.attempt, max_attempts=run.max_attempts,
                                 restarting=bool(run.restart_at), reason=run.reason, position=run.queue_position),
                      style=state_style(run.state)),
        "phase": Text(run.phase or (f"waits for {run.waits_for}" if run.waits_for else MISSING)),
        "step": _number(MISSING if run.last_step is None else str(run.last_step)),
        "loss": _number(format_float(run.loss, 4), bad=not _finite(run.loss)),
        "acc": _number(format_float(run.acc, 3)),
        "streak": _number(format_float(run.streak, 2)),
        "tau": _number(format_float(run.tau, 2)),
        "lr": _number(MISSING if run.lr is None else f"{run.lr:.2e}"),
        "tok_s": _number(format_rate(run.tok_per_s)),
        # an ended run has nothing left to wait for, whatever its last step line promised
        "eta": _number(MISSING if run.state in TERMINAL_STATES else format_duration(run.eta_s)),
        "exceptions": _number(str(run.exceptions), bad=run.exceptions > 0),
    }


def format_float(value: float | None, digits: int) -> str:
    if value is None:
        return MISSING
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}f}"


def run_label(run: RunView) -> str:
    """How a run is named in prompts: its name, and its id when that differs."""
    if run.name and run.name != run.run_id:
        return f"{run.name} ({run.run_id})"
    return run.run_id


def _number(text: str, *, bad: bool = False) -> Text:
    return Text(text, style="bold red" if bad else "", justify="right")


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)
