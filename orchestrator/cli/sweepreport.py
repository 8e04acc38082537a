"""`dflashctl sweep report ID [TARGET...] [--json|--markdown]`: a sweep's runs ranked by τ, best first.

The sweep's runs are found where its launch (or a listing) last saw them (whereabouts), else on every target;
then only they are read again with the ends of their logs, where their newest τ figures are.
"""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.table import Table

from dflash_records.run import RunRecord

from ..errors import EXIT_OK, TargetNotFound, shorten
from ..inventory.model import Inventory, Target
from ..runs import whereabouts
from ..runs.client import RunClient
from ..runs.sweepreport import REPORT_TAIL_BYTES, differing_keys, markdown, ranked, sweep_row, table_rows
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .output import about, print_json, say, stderr, stdout
from .state import AppState


def report(
    ctx: typer.Context,
    sweep_id: str = typer.Argument(..., metavar="ID", help="The sweep's id (`sweep-NAME-XXXXXX`)."),
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="Only these targets (default: where the sweep's runs are)."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"sweep_id\", \"keys\", \"runs\": [...]} as JSON."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print the table as Markdown."),
) -> int:
    """A sweep's runs, best first: ranked by the newest held-out τ, then tok/s.

    Columns: the grid values that differ, steps, τ chain (tau_heldout) and tree (tau_tree_heldout, per node
    budget), tok/s, state."""
    state: AppState = ctx.obj
    inventory = state.inventory()
    with Connections() as conns:
        client = RunClient(inventory, conns)
        chosen = sweep_targets(inventory, sweep_id, targets)
        outcomes = per_target(chosen, lambda target: _sweep_rows(client, target, sweep_id))
    for outcome in outcomes:
        if not outcome.ok:
            say(stderr(), "dflashctl: error: " + about(outcome.target.name, f"runs not read: {outcome.error}"))
    rows = ranked([row for o in outcomes for row in o.value or []])
    if not rows and all(o.ok for o in outcomes):
        raise TargetNotFound(f"no runs of sweep {shorten(sweep_id, 80)!r} on {', '.join(t.name for t in chosen)}")
    keys = differing_keys(rows)
    if as_json:
        print_json({"sweep_id": sweep_id, "keys": keys, "runs": [row.to_dict(keys) for row in rows]})
    elif as_markdown:
        stdout().print(markdown(*table_rows(rows, keys)), markup=False)
    else:
        header, cells = table_rows(rows, keys)
        table = Table(box=None, header_style="bold")
        for column in header:
            table.add_column(column, no_wrap=True)
        for row in cells:
            table.add_row(*row)
        stdout().print(table)
    return fanout_exit_code(outcomes) if outcomes else EXIT_OK


def sweep_targets(inventory: Inventory, sweep_id: str, names: list[str] | None) -> list[Target]:
    """The targets asked for a sweep's runs: those named, else those its runs were last seen on (when the
    inventory still has them all), else every target."""
    if names:
        return inventory.targets(names)
    seen = (whereabouts.places([sweep_id]) or {}).get(sweep_id) or []
    known = {t.name: t for t in inventory.all_targets()}
    return [known[name] for name in seen] if seen and all(name in known for name in seen) \
        else list(known.values())


def in_sweep(record: RunRecord, sweep_id: str) -> bool:
    return record.sweep_id == sweep_id


def _sweep_rows(client: RunClient, target: Target, sweep_id: str) -> list:
    """The sweep's runs on one target: found by their records, then read with their tails."""
    ids = [r.run_id for r in client.runs_on(target) if in_sweep(r, sweep_id)]
    if not ids:
        return []
    return [sweep_row(record, log, metrics)
            for record, log, metrics in client.runs_with_tails(target, ids, tail_bytes=REPORT_TAIL_BYTES)]


__all__ = ["report", "sweep_targets", "in_sweep"]
