"""`dflashctl ps [TARGET...] [--all] [--sweep ID] [--json]`."""
from __future__ import annotations

import datetime
from typing import List, Optional

import typer
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from dflash_records.job import JobSummary
from dflash_records.protocol import LIVE_STATES, QUEUED
from dflash_records.run import RunRecord
from dflash_records.terminaltext import without_escapes

from ..display import (age, fit_columns, format_rate, parse_stamp, record_state_text, state_style,
                       waiting_for, widest_cells)
from ..runs.client import RunClient
from ..runs.jobs import group_jobs
from ..transports.fanout import fanout_exit_code
from ..transports.pool import Connections
from .output import print_json, stderr, stdout
from .queuelist import show_queues
from .state import AppState
from .sweepreport import in_sweep, sweep_targets

RECENT = datetime.timedelta(hours=24)
COLUMNS = ("RUN", "TARGET", "NAME", "STATE", "PID", "AGE", "EXIT", "STEP", "TOK/S")
# What a narrow terminal loses first: the name (a run id starts with it), then what matters least to a person
# scanning for what is alive, how far it got and how fast; RUN and STATE always stay.
DROP_ORDER = (("NAME",), ("PID",), ("AGE",), ("TOK/S",), ("EXIT",), ("TARGET",), ("STEP",))
CELL_PADDING = 2  # rich's table pads each cell with a space on either side


def ps(
    ctx: typer.Context,
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="Only these targets (default: every target)."),
    show_all: bool = typer.Option(False, "--all", "-a", help="Also runs that ended more than 24 h ago."),
    sweep: Optional[str] = typer.Option(None, "--sweep", metavar="ID",
                                        help="Only the runs of this sweep, however old (`dflashctl sweep`)."),
    queue: bool = typer.Option(False, "--queue", help="The targets' GPU queues instead: their GPUs, and their "
                               "queued runs in the order they start, each with what it waits for and since when."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"runs\": [...], \"jobs\": [...]} as JSON "
                                 "(--queue: {\"targets\": {TARGET: its queue}})."),
) -> int:
    """List runs: state, pid, age, exit code, last step and tok/s. Hosts are asked in parallel.

    A run whose supervisor died without recording an end (the container rebooted, say) shows as `lost`.
    A multi-node job shows once, with one line per node below it; a failed job names the node that
    failed first and why. A queued run shows its place and what it waits for: `queued (2nd) for GPU 1`.
    """
    state: AppState = ctx.obj
    if sweep is None:
        resolved = state.inventory().targets(targets)
    else:
        resolved = sweep_targets(state.inventory(), sweep, targets)
    if queue:
        return show_queues(state, resolved, as_json=as_json)
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        outcomes = client.list_runs(resolved)
    now = datetime.datetime.now(datetime.timezone.utc)
    runs = [r for o in outcomes for r in (o.value or [])
            if (in_sweep(r, sweep) if sweep is not None else show_all or _recent(r, now))]
    runs.sort(key=lambda r: r.created_at or "")
    _, jobs = group_jobs(runs)
    failures = {o.target.name: str(o.error) for o in outcomes if not o.ok}
    if as_json:  # "errors" as before; "targets" says of each target whether its runs were read
        print_json({"runs": _json_runs(runs, jobs), "jobs": [job.to_dict() for job in jobs], "errors": failures,
                    "targets": {o.target.name: {"ok": o.ok, "error": failures.get(o.target.name)} for o in outcomes}})
    elif runs:
        _print_table(runs, jobs, now)
    else:
        _print_none(show_all, read=[o.target.name for o in outcomes if o.ok], unread=len(failures))
    for name, error in failures.items():
        stderr().print(f"dflashctl: error: {name}: runs not read: {error}", markup=False)
    for name, skipped in sorted(client.skipped.items()):
        for entry in skipped:
            stderr().print(f"dflashctl: warning: {name}: {entry.path} skipped: {entry.reason}",
                           markup=False)
    return fanout_exit_code(outcomes)


def _json_runs(runs: list[RunRecord], jobs: list[JobSummary]) -> list[dict]:
    """ps --json's runs: each record, a job's node with its job's state and first failure."""
    job_of = {job.job_id: job for job in jobs}
    return [job_of[run.job_id].node_dict(run) if run.job_id in job_of else run.to_dict() for run in runs]


def _print_none(show_all: bool, *, read: list[str], unread: int) -> None:
    """"no runs" only where every target was read: of a target that was not, nothing is known (its error says
    why, on stderr); when some were read, the line names them."""
    if unread and not read:
        return
    where = f" on {', '.join(read)}" if unread else ""
    stdout().print(f"no runs{where}" + ("" if show_all else " (--all shows older ones)"), markup=False)


def _recent(record: RunRecord, now: datetime.datetime) -> bool:
    if record.state in LIVE_STATES or not record.ended_at:
        return True
    return now - parse_stamp(record.ended_at) < RECENT


def _print_table(runs: list[RunRecord], jobs: list[JobSummary], now: datetime.datetime) -> None:
    """The runs as a table of the columns that fit the terminal whole, then why each failed job failed."""
    out = stdout()
    rows, notes = _rows(runs, jobs, now)
    table, needed = _table(rows, width=out.width)
    if needed <= out.width:
        out.print(table)
    else:  # a run id wider than the terminal is printed whole: the terminal wraps its line, a copy keeps it whole
        out.print(Segments(out.render(table, out.options.update_width(needed))), crop=False, soft_wrap=True)
    for note in notes:
        out.print(note, markup=False)


def _rows(runs: list[RunRecord], jobs: list[JobSummary], now: datetime.datetime) -> tuple[list[list[str]], list[str]]:
    """The table's rows (a job's row with its nodes below it, where its first node sorts), and the notes printed
    under it: why each failed job failed first, how a run that ended with an error ended (`failed, exit code 127:
    command not found: x`), and which run or job a relaunch started in place of an ended one."""
    rows: list[list[str]] = []
    notes: list[str] = []
    jobs_by_id = {job.job_id: job for job in jobs}
    for record in runs:
        if not record.job_id:
            rows.append(_row(record, now))
            if record.relaunched_as:
                notes.append(f"{record.run_id}: {record.state}; relaunched as {record.relaunched_as}")
            elif record.error and record.state not in LIVE_STATES:   # what EXIT cannot say: a start that failed
                notes.append(f"{record.run_id}: {without_escapes(record.ended_text())}")
        elif record.job_id in jobs_by_id:
            job = jobs_by_id.pop(record.job_id)
            rows += _job_rows(job, now)
            first, after = job.failed_first, job.relaunched_as
            said = ([f"failed first: {first.reason}"] if first else []) + \
                ([f"relaunched as {after}"] if after else [])
            if said:
                notes.append(f"{job.job_id}: {'; '.join(said)}")
    return rows, notes


def _table(rows: list[list[str]], *, width: int) -> tuple[Table, int]:
    """The columns that fit `width` whole (DROP_ORDER says which go first), and the width the table needs at
    least; a number is never cut, and a run id never: where even RUN and STATE do not fit whole, STATE is cut
    short, never below its header."""
    widths = widest_cells({column: column for column in COLUMNS},
                          ({column: Text.from_markup(cell) for column, cell in zip(COLUMNS, row)} for row in rows))
    shown = fit_columns(widths, width=width, gap=CELL_PADDING, drop=DROP_ORDER) or ("RUN", "STATE")
    state_room = max(width - widths["RUN"] - 2 * CELL_PADDING, len("STATE"))
    table = Table(box=None, header_style="bold")
    for column in shown:
        if column == "STATE" and shown == ("RUN", "STATE"):
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=min(widths[column], state_room))
        else:
            table.add_column(column, no_wrap=True, min_width=widths[column])
    indexes = [COLUMNS.index(column) for column in shown]
    for row in rows:
        table.add_row(*(row[i] for i in indexes))
    return table, widths["RUN"] + 2 * CELL_PADDING + len("STATE")


def _job_rows(job: JobSummary, now: datetime.datetime) -> list[list[str]]:
    first = job.failed_first
    exit_text = f"node {first.node_rank} first" if first else "-"
    rows = [[job.job_id, f"{job.nnodes} nodes", job.name or "-", _state(job.state), "-",
             age(job.created_at, now), exit_text, _number(job.last_step), format_rate(job.tok_per_s)]]
    for record in job.nodes:
        cells = _row(record, now)
        cells[0] = f"  node {record.node_rank}: {record.run_id}"
        rows.append(cells)
    return rows


def _row(r: RunRecord, now: datetime.datetime) -> list[str]:
    exit_text = f"sig {r.signal}" if r.signal else ("-" if r.exit_code is None else str(r.exit_code))
    return [r.run_id, r.target or "-", r.name or "-", _state(r.state, _state_words(r)), str(r.pid or "-"),
            age(r.created_at, now), exit_text, _number(r.last_step), format_rate(r.tok_per_s)]


def _state_words(r: RunRecord) -> str:
    """The STATE cell's words: a queued run's place and what it waits for too (`queued (2nd) for GPU 1`)."""
    text = record_state_text(r)
    return f"{text} for {waiting_for(r.gpus, r.gpu_count)}" if r.state == QUEUED else text


def _state(state: str | None, text: str | None = None) -> str:
    return f"[{state_style(state)}]{text or state}[/]"


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)

