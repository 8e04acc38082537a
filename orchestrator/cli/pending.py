"""Commands whose implementation has not landed yet. They exist so the CLI's shape is visible in --help."""
from __future__ import annotations

import typer

from ..errors import UsageError

PLANNED = {
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
