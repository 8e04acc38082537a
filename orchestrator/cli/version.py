"""`dflashctl version [--json]` and the root's `--version`."""
from __future__ import annotations

import typer

from ..errors import EXIT_OK, DflashError
from ..inventory.model import LOCAL, builtin_inventory
from ..transports.local import LocalTransport
from ..versions import controller_versions, one_line, trainer_versions
from .output import print_json, stdout
from .state import AppState


def version(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> int:
    """Versions: dflashctl, its agent, this Python, and the torch and transformers the `local` target's
    Python would train with (asked of that Python by package metadata; torch is never imported here)."""
    state: AppState = ctx.obj
    report = {**controller_versions(), "local": _local(state)}
    if as_json:
        print_json(report)
        return EXIT_OK
    out = stdout()
    out.print(one_line(), markup=False)
    local = report["local"]
    if local.get("error"):
        out.print(f"local: {local['error']}", markup=False)
        return EXIT_OK
    packages = ", ".join(f"{name} {local.get(name) or 'not installed'}" for name in ("torch", "transformers"))
    out.print(f"local trainer: Python {local.get('python')} ({local.get('executable')}), {packages}", markup=False)
    return EXIT_OK


def _local(state: AppState) -> dict:
    try:
        target = state.inventory().target(LOCAL)
    except DflashError:  # a broken inventory must not hide the versions: the built-in local target
        target = builtin_inventory().target(LOCAL)
    return trainer_versions(LocalTransport(LOCAL), target)


def print_version(value: bool) -> None:
    """Root option callback: `dflashctl --version` prints one line and exits before any command runs."""
    if value:
        print(one_line())
        raise typer.Exit(0)
