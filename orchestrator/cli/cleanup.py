"""`dflashctl cleanup TARGET [--dry-run] [--json]`."""
from __future__ import annotations

from typing import List

import typer

from dflash_records.plans import CleanupAnswer
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
    if as_json:
        print_json({"targets": {o.target.name: (o.value.to_dict() if o.ok else {"ok": False, "error": str(o.error)})
                                for o in outcomes}})
    else:
        _print([(o.target.name, o.value) for o in outcomes if o.ok and not _unread(o.value)])
    for outcome in outcomes:  # not looked at (unreachable, refused): an error, never "nothing to clean"
        if not outcome.ok or _unread(outcome.value):
            error = str(outcome.error) if not outcome.ok else outcome.value.error
            say(stderr(), "dflashctl: error: " + about(outcome.target.name, error))
    return fanout_exit_code(outcomes, lambda answer: answer.ok)


def _unread(answer: CleanupAnswer) -> bool:
    """The agent's error answer: cleanup did not run there (it reports no actions, not even none)."""
    return bool(answer.error) and not answer.actions


def _print(answers: list[tuple[str, CleanupAnswer]]) -> None:
    out = stdout()
    for target, answer in answers:
        if answer.error and not answer.ok:
            say(out, about(target, answer.error))
        say(out, answer.summary(target))
        for action in answer.actions:
            say(out, f"  - {action.shown()}")
        for finding in answer.findings:
            say(out, f"  ! {finding.shown()}")
        for entry in answer.foreign_zombies:
            say(out, f"  ! {entry.description}")
        for advice in answer.foreign_advice():
            say(out, f"    {advice}")
