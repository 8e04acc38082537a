"""`dflashctl watch [TARGET...] [--once] [--json] [--interval S]`."""
from __future__ import annotations

import math
from typing import List, Optional

import typer
from rich.table import Table

from ..display import format_bytes, format_rate
from ..errors import EXIT_OK, EXIT_UNREACHABLE, UsageError
from ..watch.alerts import DiskRules
from ..watch.model import Snapshot
from ..watch.source import LiveSource
from .args import finite
from .output import print_json, stderr, stdout
from .state import AppState


def watch(
    ctx: typer.Context,
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="Only these targets (default: every target)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit instead of opening the dashboard."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print the snapshot as one JSON object."),
    interval: float = typer.Option(1.0, "--interval", min=0.1, callback=finite, metavar="S",
                                   help="Seconds between GPU samples (nvidia-smi loops in the container)."),
    timeout: float = typer.Option(30.0, "--timeout", min=0.0, callback=finite, metavar="S",
                                  help="With --once: the longest wait for every target to answer."),
    min_free_gib: float = typer.Option(DiskRules.min_free_bytes / 1024 ** 3, "--min-free-gib", min=0.0,
                                       callback=finite, metavar="GIB",
                                       help="low_disk alert: a container's runs filesystem has less free than this..."),
    min_free_pct: float = typer.Option(DiskRules.min_free_fraction * 100, "--min-free-pct", min=0.0, max=100.0,
                                       callback=finite, metavar="PCT", help="...or less than this share of it."),
) -> int:
    """The live dashboard of every run, GPU and alert of the targets (keys: k kill, l log, c cleanup, / filter,
    m switch chart, ? help, q quit).

    One SSH connection per host and one small agent per container stream new log lines, run states and
    nvidia-smi samples; a lost host is retried with backoff while the others keep updating. With --once, waits
    until every target has answered (or failed), prints what the dashboard would show, and exits: 0, or 3 when
    a target is unreachable.
    """
    if as_json and not once:
        raise UsageError("--json needs --once (the dashboard itself is interactive)")
    state: AppState = ctx.obj
    inventory = state.inventory()
    resolved = inventory.targets(targets)
    disk = DiskRules(min_free_bytes=min_free_gib * 1024 ** 3, min_free_fraction=min_free_pct / 100)
    if not once:
        from tui import run_dashboard

        run_dashboard(LiveSource(inventory, resolved, gpu_interval=interval, disk_rules=disk))
        return EXIT_OK
    if not as_json:
        stderr().print(f"watching {len(resolved)} target(s) once...")
    with LiveSource(inventory, resolved, gpu_interval=interval, disk_rules=disk) as source:
        source.wait_until_answered(timeout)
        source.settle()
        snapshot = source.snapshot()
        unreachable = source.unreachable()
    if as_json:
        print_json({**json_safe(snapshot.as_dict()), "errors": unreachable})
    else:
        _print(snapshot, unreachable)
    return EXIT_UNREACHABLE if unreachable else EXIT_OK


def _print(snapshot: Snapshot, unreachable: dict[str, str]) -> None:
    out = stdout()
    table = Table(box=None, header_style="bold")
    for column in ("TARGET", "RUN", "STATE", "PHASE", "STEP", "LOSS", "ACC", "TOK/S", "EXC"):
        table.add_column(column, no_wrap=True)
    for run in snapshot.runs:
        table.add_row(run.target, run.run_id, run.state, run.phase or "-", _value(run.last_step),
                      _value(run.loss, "{:.4f}"), _value(run.acc, "{:.3f}"),
                      format_rate(run.tok_per_s), str(run.exceptions))
    out.print(table if snapshot.runs else "no runs")
    for gpu in snapshot.gpus:
        out.print(f"{gpu.target} GPU{gpu.index}: {_value(gpu.memory_used_mib, '{:.0f}')}/"
                  f"{_value(gpu.memory_total_mib, '{:.0f}')} MiB, {_value(gpu.utilization_pct, '{:.0f}')} %",
                  markup=False)
    for host in snapshot.hosts:
        if host.free_bytes is not None:
            out.print(f"{host.name}: {format_bytes(host.free_bytes)} free of {format_bytes(host.total_bytes)} "
                      f"where runs write{' (low)' if host.low_disk else ''}", markup=False)
    for alert in snapshot.alerts[-20:]:
        out.print(f"{alert.time} {alert.severity} {alert.target} {alert.run_id}: {alert.message}", markup=False)
    for name, error in unreachable.items():
        stderr().print(f"{name}: {error}", markup=False)


def json_safe(value: object) -> object:
    """Strict JSON, as metrics.jsonl writes it: NaN becomes null, infinities the strings "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _value(value: object, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)
