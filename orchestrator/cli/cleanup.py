"""`dflashctl cleanup TARGET [--dry-run] [--json]`."""
from __future__ import annotations

from typing import List

import typer

from ..agent.cleanup import summary
from ..runs.client import RunClient
from ..transports.fanout import fanout_exit_code, per_host
from ..transports.pool import Connections
from .output import about, print_json, say, stderr, stdout
from .state import AppState


def cleanup(
    ctx: typer.Context,
    targets: List[str] = typer.Argument(..., metavar="TARGET", help="HOST/CTID, HOST or local."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Change nothing; list what would be done."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"targets\": {...}} as JSON."),
) -> int:
    """Clean up after runs: end orphans of ended runs (and so reap the zombies stuck ones hold), mark dead runs
    `lost`, and report what cannot be fixed here (zombies of a PID 1 that never reaps; zombies of a process no
    run owns, which is never ended; GPU memory held while no run is live)."""
    state: AppState = ctx.obj
    resolved = state.inventory().targets(targets)
    stderr().print(("planning" if dry_run else "cleaning up") + f" {len(resolved)} target(s)...")
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        outcomes = per_host(resolved, lambda t: client.cleanup(t, dry_run=dry_run))
    report = {o.target.name: (o.value if o.ok else {"ok": False, "error": str(o.error)}) for o in outcomes}
    if as_json:
        print_json({"targets": report})
    else:
        _print(report, dry_run)
    for name, result in report.items():  # not looked at (unreachable, refused): an error, never "nothing to clean"
        if result.get("error") and "actions" not in result:
            say(stderr(), "dflashctl: error: " + about(name, result["error"]))
    return fanout_exit_code(outcomes, lambda result: bool(result.get("ok")))


def _print(report: dict, dry_run: bool) -> None:
    out = stdout()
    for target, result in report.items():
        if result.get("error") and "actions" not in result:
            continue  # an error line on stderr (cleanup)
        if result.get("error") and not result.get("ok"):
            say(out, about(target, result["error"]))
        actions = result.get("actions") or []
        say(out, summary(target, actions, dry_run=dry_run))
        for action in actions:
            say(out, f"  - {action.get('description') or action}")
        for finding in result.get("unfixable") or result.get("findings") or []:
            say(out, f"  ! {finding.get('description') or finding}")
        foreign = result.get("foreign_zombies") or []
        for entry in foreign:
            say(out, f"  ! {entry.get('description') or entry}")
        for advice in dict.fromkeys(entry.get("advice") for entry in foreign if entry.get("advice")):
            say(out, f"    {advice}")  # the same for every parent: once
