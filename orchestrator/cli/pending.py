"""Commands whose implementation has not landed yet. They exist so the CLI's shape is visible in --help."""
from __future__ import annotations

import typer

from ..errors import UsageError

PLANNED = {
    "launch": "Deploy the bundled trainer (or run -- CMD) on TARGET, detached under a supervisor.",
    "ps": "List runs with state, pid, age, exit code, last step and tok/s.",
    "logs": "Show (or follow with -f) the log of RUN.",
    "kill": "Stop RUN completely: TERM, KILL after the grace, verify nothing is left.",
    "cleanup": "Reap zombies, end orphans of ended runs, mark dead runs lost on TARGET.",
    "watch": "The live dashboard of every run and GPU (--once --json: one snapshot).",
    "demo": "Make a tiny model and data, launch a short run on `local` and watch it.",
}


def register(app: typer.Typer) -> None:
    for name, summary in PLANNED.items():
        app.command(name, help=f"{summary}\n\n(Not built yet in this version.)",
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_pending(name))


def _pending(name: str):
    def command(ctx: typer.Context) -> int:
        raise UsageError(f"`dflashctl {name}` is not built yet in this version")

    command.__name__ = name
    return command
