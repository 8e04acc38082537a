"""`dflashctl kill RUN... [--grace S] [--json]`."""
from __future__ import annotations

from collections import defaultdict
from typing import List, Optional

import typer

from ..connections import Connections
from ..errors import DflashError
from ..fanout import per_host
from ..jobs import locate
from ..runs import RunClient
from .usage import finite
from .state import AppState, about, print_json, stderr, stdout


def kill(
    ctx: typer.Context,
    run_ids: List[str] = typer.Argument(..., metavar="RUN", help="Run or job ids (see `dflashctl ps`)."),
    grace: Optional[float] = typer.Option(None, "--grace", "-g", min=0, callback=finite,
                                          help="Seconds between TERM and KILL (default: the run's, 30)."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"targets\": {...}} as JSON."),
) -> int:
    """Stop runs completely: TERM to the run's processes, KILL after the grace, then verify nothing is left.

    Exits 0 only when no process of any named run survives; otherwise says what survived and exits 1.
    Killing a run that already ended does nothing and succeeds. A job id stops every node of the job.
    """
    state: AppState = ctx.obj
    err = stderr()
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        located = locate(client, list(dict.fromkeys(run_ids)))
        by_target: dict[str, list[str]] = defaultdict(list)
        targets = {}
        for run_id, (target, _) in located.items():
            by_target[target.name].append(run_id)
            targets[target.name] = target
        err.print(f"stopping {len(located)} run(s) (TERM, KILL after "
                  f"{'the run grace' if grace is None else f'{grace:g}s'})...")
        outcomes = per_host(list(targets.values()), lambda t: client.kill(t, by_target[t.name], grace=grace))
    report = {o.target.name: (o.value if o.ok else {"ok": False, "error": str(o.error)}) for o in outcomes}
    if as_json:
        print_json({"targets": report})
    else:
        _print(report)
    failed = [o for o in outcomes if not o.ok or not o.value.get("ok")]
    if any(isinstance(o.error, DflashError) and o.error.exit_code == 3 for o in failed):
        return 3
    return 1 if failed else 0


def _print(report: dict) -> None:
    out = stdout()
    for target, result in report.items():
        if result.get("error") and not result.get("runs"):
            out.print(about(target, result["error"]), markup=False)
        for run in result.get("runs", []):
            line = f"{run.get('run_id')} on {target}: {run.get('state')}"
            if run.get("signal"):
                line += f" (signal {run['signal']})"
            survivors = run.get("survivors") or []
            if survivors:
                line += "; STILL ALIVE: " + ", ".join(f"{p.get('pid')} {p.get('cmdline', '')[:60]}"
                                                     for p in survivors)
            out.print(line, markup=False)
