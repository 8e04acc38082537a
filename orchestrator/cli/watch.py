"""`dflashctl watch [TARGET...] [--once] [--json] [--interval S] [--headless] [--notify URL]...`."""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections import Counter
from typing import List, Optional

import typer
from rich.table import Table

from dflash_records.protocol import GIB, LOW_FREE_BYTES, LOW_FREE_FRACTION

from ..display import format_bytes, format_rate
from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UsageError
from ..notify.destinations import Destination
from ..notify.destinations import destinations as notify_destinations
from ..notify.sender import Unsent, by_destination
from ..watch.alerts import AlertRules
from ..watch.model import MAX_HISTORY, RECENT, Snapshot, first_look, summarise_ended
from ..watch.source import LiveSource
from ..watch.stream import ONCE_CAP_FACTOR, ONCE_WAIT_S
from .args import number_in
from .output import print_json, stderr, stdout
from .state import AppState
from .watchserve import serve_dashboard


# the low_disk alert's marks (doctor's, by default)
MIN_FREE_GIB = typer.Option(LOW_FREE_BYTES / GIB, "--min-free-gib", callback=number_in(0), metavar="GIB",
                            help="low_disk alert: a container's runs filesystem has less free than this...")
MIN_FREE_PCT = typer.Option(LOW_FREE_FRACTION * 100, "--min-free-pct", callback=number_in(0, 100),
                            metavar="PCT", help="...or less than this share of it.")
# a stream waits FIRST_WORD_S for its agent's first word: --once must not give up on a target before that
ONCE_TIMEOUT = typer.Option(ONCE_WAIT_S, "--timeout", callback=number_in(0), metavar="S",
                            help="With --once: how long to wait while no target answers (a loaded container may "
                            "take most of a minute to start the agent; a slow fleet that keeps answering is "
                            f"waited for, up to {ONCE_CAP_FACTOR} times this in all).")

ALL_RUNS = typer.Option(False, "--all", help="With --once: every run whole; by default an ended run is summarised "
                        "(its record, last step and last exception, without its log tail and metrics history).")
HISTORY = typer.Option(RECENT, "--history", callback=number_in(1, MAX_HISTORY), metavar="N",
                       help=f"With --once: each run's last N steps and N log lines (up to {MAX_HISTORY}; the "
                       "dashboard's own history).")
NOTIFY = typer.Option(None, "--notify", metavar="URL", help="Also send alerts to this apprise URL (ntfy://, slack://, "
                      "json://...; repeatable) besides the inventory's notify: entries; kinds: failed, killed, lost, "
                      "restarted, exception, stall, gpu_idle_held, nan (needs dflashctl[notify]).")
NOTIFY_REPEAT = typer.Option(None, "--notify-repeat", callback=number_in(0), metavar="S", help="At most one "
                             "notification per alert kind and run in S seconds (default 600, or the entry's repeat_s).")
STALL = typer.Option(None, "--stall", callback=number_in(0.1), metavar="S", help="A run is stalled after S seconds "
                     "without a new step, or 5 median step intervals if longer (default: 120 s, and 900 s until three "
                     "steps are timed).")


def watch(
    ctx: typer.Context,
    targets: Optional[List[str]] = typer.Argument(None, metavar="TARGET",
                                                  help="Only these targets (default: every target)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit instead of opening the dashboard."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print the snapshot as one JSON object."),
    interval: float = typer.Option(1.0, "--interval", callback=number_in(0.1), metavar="S",
                                   help="Seconds between GPU samples (nvidia-smi loops in the container)."),
    timeout: float = ONCE_TIMEOUT,
    all_runs: bool = ALL_RUNS,
    history: int = HISTORY,
    headless: bool = typer.Option(False, "--headless", help="No screen: alerts as JSON lines on stdout, notifications "
                                  "sent, lost runs with a restart policy relaunched (once per loss), until SIGTERM. "
                                  "Detached: `dflashctl launch local -- dflashctl watch --headless`."),
    notify: Optional[List[str]] = NOTIFY,
    notify_repeat: Optional[float] = NOTIFY_REPEAT,
    no_notify: bool = typer.Option(False, "--no-notify", help="Send nothing, the inventory's notify: entries "
                                   "included (e.g. while a headless watcher sends them)."),
    stall: Optional[float] = STALL,
    serve: bool = typer.Option(False, "--serve", help="Serve the dashboard to a browser instead of this terminal "
                               "(needs the serve extra: pip install 'dflashctl[serve]')."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR",
                             help="With --serve: the address to listen on; any but loopback needs a token."),
    port: int = typer.Option(8000, "--port", callback=number_in(1, 65535), metavar="PORT", help="With --serve: the port to listen on."),
    token: Optional[str] = typer.Option(None, "--token", metavar="T", help="With --serve: the token every "
                                        "request must carry (?token=T), 16 characters at least; made up and "
                                        "printed off loopback."),
    min_free_gib: float = MIN_FREE_GIB,
    min_free_pct: float = MIN_FREE_PCT,
) -> int:
    """The live dashboard of every run, GPU and alert of the targets (keys: k kill, l log, c cleanup, / filter,
    m switch chart, ? help, q quit).

    One SSH connection per host and one small agent per container stream new log lines, run states and
    nvidia-smi samples; a lost host is retried with backoff while the others keep updating. With --once, waits
    until every target has answered (or failed), prints what the dashboard would show, and exits: 0, or 3 when
    a target is unreachable. Alerts go to the inventory's notify: entries and --notify URLs while it runs;
    --headless runs it without a screen, printing them as JSON lines. --serve runs the same dashboard once per
    browser tab at http://HOST:PORT/ (off loopback every request needs the token; the tabs notify nobody).
    """
    _check_options(once=once, as_json=as_json, all_runs=all_runs, history=history, headless=headless, notify=notify,
                   no_notify=no_notify, serve=serve, serving=(host, port, token), tuning=(stall, notify_repeat))
    state: AppState = ctx.obj
    inventory = state.inventory()
    resolved = inventory.targets(targets)
    if serve:
        return serve_dashboard(state, [t.name for t in resolved] if targets else [], interval, once=once,
                               host=host, port=port, token=token)
    rules = _rules(stall, min_free_gib, min_free_pct)
    # a snapshot keeps, and so reads, no more of each run than it prints: its last steps and lines
    bounds = {"history": history, "log_tail": history, "first_look": first_look(history)} if once else {}
    source = LiveSource(inventory, resolved, gpu_interval=interval, rules=rules, **bounds)
    if not once:
        sinks = [] if no_notify else notify_destinations(inventory, notify or [], repeat_s=notify_repeat)
        return _live(source, sinks, headless=headless)
    return _once(source, timeout=timeout, as_json=as_json, all_runs=all_runs)


def _check_options(*, once: bool, as_json: bool, all_runs: bool, history: int, headless: bool,
                   notify: list[str] | None, no_notify: bool, serve: bool, serving: tuple, tuning: tuple) -> None:
    """The combinations of options that cannot go together, each a usage error (exit 2)."""
    if as_json and not once:
        raise UsageError("--json needs --once (the dashboard itself is interactive)")
    if (all_runs or history != RECENT) and not once:
        raise UsageError(f"{'--all' if all_runs else '--history'} goes with --once (the dashboard keeps every run's "
                         "history already)")
    if not serve and serving != ("127.0.0.1", 8000, None):
        raise UsageError("--host, --port and --token go with --serve")
    if serve and (headless or notify or any(value is not None for value in tuning)):
        raise UsageError("--serve serves the dashboard: --headless, --notify, --notify-repeat and --stall do not "
                         "go with it (run a headless watcher beside it for notifications)")
    if once and (headless or notify):
        raise UsageError(f"{'--headless' if headless else '--notify'} needs a live watch, not --once")
    if notify and no_notify:
        raise UsageError("--notify and --no-notify contradict each other")
    if not (once or headless or serve or _has_screen()):
        raise UsageError("the dashboard needs a terminal, and stdout is not one (a pipe or a file would get "
                         "escape codes forever): --once prints one snapshot, --headless runs without a screen, "
                         "--serve serves it to a browser")


def _has_screen() -> bool:
    """stdout is a terminal, or Textual was handed another screen (`watch --serve` runs each tab's dashboard
    with textual-serve's web driver, its stdout a pipe to the server)."""
    return sys.stdout.isatty() or bool(os.environ.get("TEXTUAL_DRIVER"))


def _once(source: LiveSource, *, timeout: float, as_json: bool, all_runs: bool = False) -> int:
    """One snapshot once every target answered (or failed): 0, or 3 when a target is unreachable."""
    if not as_json:
        stderr().print(f"watching {len(source.targets)} target(s) once...")
    started = time.monotonic()
    with source:
        source.wait_while_answering(timeout, cap_s=ONCE_CAP_FACTOR * timeout)
        source.settle()
        snapshot = source.snapshot() if all_runs else summarise_ended(source.snapshot())
        unreachable = source.unreachable(waited_s=time.monotonic() - started)
    if as_json:
        print_json({**json_safe(snapshot.as_dict()), "errors": unreachable})
    else:
        _print(snapshot, unreachable, len(source.targets))
    return EXIT_UNREACHABLE if unreachable else EXIT_OK


def _live(source: LiveSource, sinks: list[Destination], *, headless: bool) -> int:
    """The dashboard, or (headless) the JSON lines; notifications go out from threads beside either. 0 once
    stopped, 1 when the stop left notifications unsent."""
    from ..notify.headless import run_headless
    from ..notify.pump import AlertPump

    if headless:
        stderr().print(f"watching {len(source.targets)} target(s) without a screen, notifying {len(sinks)} "
                       "destination(s); SIGTERM stops", markup=False)
        return _report_unsent(run_headless(source, sinks))
    from tui import run_dashboard

    pump = AlertPump(source, sinks).start() if sinks else None
    unsent: list[Unsent] = []
    try:
        run_dashboard(source)
    finally:
        if pump is not None:
            unsent = pump.stop()
    return _report_unsent(unsent)


def _report_unsent(unsent: list[Unsent]) -> int:
    """One line per destination that was left with notifications: a watcher that could not deliver them failed
    at its job (exit 1), even when it was stopped as asked."""
    for destination, left in by_destination(unsent).items():
        kinds = ", ".join(f"{count} {kind}" for kind, count in Counter(u.message.kind for u in left).items())
        reasons = "; ".join(dict.fromkeys(u.reason for u in left))
        stderr().print(f"{len(left)} notification{'s' if len(left) > 1 else ''} not sent to {destination.shown} "
                       f"({kinds}): {reasons}", markup=False)
    return EXIT_FAILED if unsent else EXIT_OK


def _rules(stall: float | None, min_free_gib: float, min_free_pct: float) -> AlertRules:
    rules = AlertRules(min_free_bytes=min_free_gib * GIB, min_free_fraction=min_free_pct / 100)
    return rules if stall is None else dataclasses.replace(rules, stall_floor_s=stall, stall_startup_s=stall)


def _print(snapshot: Snapshot, unreachable: dict[str, str], targets: int) -> None:
    out = stdout()
    table = Table(box=None, header_style="bold")
    for column in ("TARGET", "RUN", "STATE", "PHASE", "STEP", "LOSS", "ACC", "TOK/S", "EXC"):
        table.add_column(column, no_wrap=True)
    for run in snapshot.runs:
        table.add_row(run.target, run.run_id, run.state, run.phase or "-", _value(run.last_step),
                      _value(run.loss, "{:.4f}"), _value(run.acc, "{:.3f}"),
                      format_rate(run.tok_per_s), str(run.exceptions))
    out.print(table if snapshot.runs else _no_runs(unreachable, targets))
    for run in snapshot.runs:
        if run.bottleneck is not None:
            out.print(f"{run.target} {run.run_id} {run.bottleneck.evidence}", markup=False)
    for target, gpu in ((view.target, view.row) for view in snapshot.gpus):
        out.print(f"{target} GPU{gpu.index}: {_value(gpu.memory_used_mib, '{:.0f}')}/"
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


def _no_runs(unreachable: dict[str, str], targets: int) -> str:
    """What an empty table means: no runs, or none on the targets that answered (an unreachable target may
    well have live runs: never "no runs" for it)."""
    if not unreachable:
        return "no runs"
    if len(unreachable) >= targets:
        return f"runs not read: unreachable: {', '.join(unreachable)}"
    return f"no runs on the targets that answered; not read (unreachable): {', '.join(unreachable)}"


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
