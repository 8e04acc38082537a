"""`dflashctl doctor [TARGET...] [--json]`."""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.table import Table

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from ..runs.doctor import DoctorReport, check_target
from ..transports.fanout import per_host
from ..transports.pool import Connections
from .output import about, print_json, stderr, stdout
from .state import AppState


def doctor(
    ctx: typer.Context,
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="HOST/CTID, HOST or local (default: every target)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> int:
    """Check every target: reachable, host key, login, pct, container running, python, nvidia-smi and GPUs,
    and show the size of its compile cache ({workdir}/.dflash/cache).

    Hosts are checked in parallel. Exit 0 when all is well, 3 when a target is unreachable (the others are still
    reported), 1 when a check failed.
    """
    state: AppState = ctx.obj
    resolved = state.inventory().targets(targets)
    stderr().print(f"checking {len(resolved)} target(s)...") if as_json else None
    with Connections() as conns:
        outcomes = per_host(resolved, lambda t: check_target(conns, t))
    reports = [o.value if o.ok else DoctorReport(o.target.name, error=str(o.error)) for o in outcomes]
    if as_json:
        print_json({"targets": {r.target: r.as_dict() for r in reports}})
    else:
        stdout().print(_table(reports))
        for r in reports:
            for message in ([r.error] if r.error else []) + r.warnings:
                stdout().print(about(r.target, message), markup=False)
    if any(r.unreachable for r in reports):
        return EXIT_UNREACHABLE
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED


def _mark(value: bool | None) -> str:
    return {True: "[green]ok[/]", False: "[red]no[/]", None: "[dim]-[/]"}[value]


def _size(size: int | None) -> str:
    """Bytes as a person reads them: 0 B, 296 KiB, 1.2 GiB."""
    if size is None:
        return "-"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit in ("B", "KiB") or value >= 100 else f"{value:.1f} {unit}"


def _table(reports: list[DoctorReport]) -> Table:
    table = Table(title="dflashctl doctor", title_justify="left")
    for col in ("target", "reach", "host key", "login", "pct", "container", "python", "GPUs", "cache", "status"):
        table.add_column(col)
    for r in reports:
        gpus = "-" if r.gpus is None else (f"{len(r.gpus)}" + (f" {r.gpus[0]['name']}" if r.gpus and
                                                                 r.gpus[0].get("name") else ""))
        table.add_row(r.target, _mark(r.reachable), _mark(r.host_key_ok), _mark(r.auth_ok), _mark(r.pct),
                      r.container or "-", r.python or "-", gpus, _size(r.cache_bytes),
                      "[green]ok[/]" if r.ok else "[red]unreachable[/]" if r.unreachable else "[red]failed[/]")
    return table
