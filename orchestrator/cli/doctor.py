"""`dflashctl doctor [TARGET...] [--config FILE] [--json]`."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ..display import format_bytes
from ..errors import worst_exit_code
from ..runs.client import RunClient
from ..runs.doctor import FAIL, OK, WARN, DoctorReport, check_target, read_needs
from ..transports.fanout import per_host
from ..transports.pool import Connections
from .output import about, print_json, stderr, stdout
from .state import AppState

STATUS_STYLE = {OK: "[green]ok[/]", WARN: "[yellow]warn[/]", FAIL: "[red]fail[/]"}


def doctor(
    ctx: typer.Context,
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="HOST/CTID, HOST or local (default: every target)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", metavar="FILE",
                                          help="Also check what this trainer config needs on each target."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> int:
    """Check every target: reachable, host key, login, pct, container running, python, nvidia-smi and GPUs,
    then what a GPU run needs there: the host's kernel module against the container's libnvidia-ml, the
    /dev/nvidia* nodes and the CT config's device and mount entries, /dev/shm, the workdir's free space and
    inodes, CPU and memory limits, GPU memory held with no live run. With --config, also the config's paths
    (there, and not on tmpfs), room for its checkpoints, /dev/shm for its processes, and the trainer's own check
    of the config there (what launch runs first).

    One row per check: ok, warn or fail, and the fix. Hosts are checked in parallel. Exit 0 when nothing
    failed (warnings allowed), 3 when a target is unreachable (the others are still reported), 1 when a check
    failed, 2 for a config that cannot be read.
    """
    state: AppState = ctx.obj
    resolved = state.inventory().targets(targets)
    needs = read_needs(config) if config is not None else None
    stderr().print(f"checking {len(resolved)} target(s)...") if as_json else None
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        outcomes = per_host(resolved, lambda t: check_target(client, t, needs))
    reports = [o.value if o.ok else DoctorReport(o.target.name, error=str(o.error)) for o in outcomes]
    choice = state.inventory_choice()
    if as_json:
        print_json({"inventory": {"path": str(choice.path) if choice.path else None, "source": choice.source},
                    "targets": {r.target: r.as_dict() for r in reports}})
    else:
        stdout().print(f"inventory: {choice.describe()}", markup=False)
        _print(reports)
    return worst_exit_code(r.exit_code for r in reports)


def _print(reports: list[DoctorReport]) -> None:
    out = stdout()
    out.print(_table(reports))
    for r in reports:
        if r.checks:
            out.print(_rows(r))
        elif r.error:
            out.print(about(r.target, r.error), markup=False)


def _mark(value: bool | None) -> str:
    return {True: "[green]ok[/]", False: "[red]no[/]", None: "[dim]-[/]"}[value]


def _table(reports: list[DoctorReport]) -> Table:
    table = Table(title="dflashctl doctor", title_justify="left")
    for col in ("target", "reach", "host key", "login", "pct", "container", "python", "agent", "GPUs", "cache",
                "status"):
        table.add_column(col)
    for r in reports:
        gpus = "-" if r.gpus is None else (f"{len(r.gpus)}" + (f" {r.gpus[0].name}" if r.gpus and
                                                                 r.gpus[0].name else ""))
        table.add_row(r.target, _mark(r.reachable), _mark(r.host_key_ok), _mark(r.auth_ok), _mark(r.pct),
                      r.container or "-", r.python or "-", r.agent or "-", gpus, format_bytes(r.cache_bytes),
                      "[green]ok[/]" if r.ok else "[red]unreachable[/]" if r.unreachable else "[red]failed[/]")
    return table


def _rows(report: DoctorReport) -> Table:
    table = Table(title=report.target, title_justify="left", show_lines=False)
    for col in ("check", "", "found", "fix"):
        table.add_column(col, overflow="fold")
    for row in report.checks:
        table.add_row(row.name, STATUS_STYLE.get(row.status, row.status), row.detail, row.fix)
    return table
