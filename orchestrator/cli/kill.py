"""`dflashctl kill RUN... [--grace S] [--json]`."""
from __future__ import annotations

from collections import defaultdict
from typing import List, Optional

import typer

from dflash_records.answers import KillAnswer
from dflash_records.protocol import KILLED, QUEUED, TERMINAL_STATES

from ..inventory.model import Target
from ..runs.addressing import Match, locate
from ..runs.client import RunClient
from ..transports.fanout import fanout_exit_code, per_target
from ..transports.pool import Connections
from .args import number_in
from .output import about, print_json, say, stderr, stdout
from .state import AppState


def kill(
    ctx: typer.Context,
    run_ids: List[str] = typer.Argument(..., metavar="RUN",
                                        help="Run or job ids, unique prefixes of them, or names given at launch "
                                             "(the newest run of the name, live ones first)."),
    grace: Optional[float] = typer.Option(None, "--grace", "-g", callback=number_in(0), metavar="S",
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
        matches = locate(client, list(dict.fromkeys(run_ids)), one_live=True)
        for match in matches:
            if match.note:
                err.print(match.note, markup=False)
        targets, by_target = _by_target(matches)
        _say_what_stops(matches, grace)
        outcomes = per_target(list(targets.values()), lambda t: client.kill(t, by_target[t.name], grace=grace))
    # a target not asked (unreachable, refused): its error, as the agent says an error
    answers = {o.target.name: (o.value if o.ok else KillAnswer(ok=False, error=str(o.error))) for o in outcomes}
    if as_json:
        print_json({"targets": {o.target.name: (o.value.to_dict() if o.ok else {"ok": False, "error": str(o.error)})
                                for o in outcomes}})
    else:
        _print(answers, queued={record.run_id for match in matches for _, record in match.runs
                                if record.state == QUEUED})
    return fanout_exit_code(outcomes, lambda answer: answer.ok)


def _say_what_stops(matches: list[Match], grace: float | None) -> None:
    """What the kill is about to do: stop live runs (TERM, then KILL), take queued ones out of their queue (they
    have no process: nothing is signalled, and they never start); an ended run is only reported below."""
    states = {record.run_id: record.state for match in matches for _, record in match.runs}
    queued = sum(state == QUEUED for state in states.values())
    live = sum(state not in TERMINAL_STATES and state != QUEUED for state in states.values())
    if live:
        stderr().print(f"stopping {live} run{'s' if live != 1 else ''} (TERM, KILL after "
                       f"{'the run grace' if grace is None else f'{grace:g}s'})...")
    if queued:
        stderr().print(f"taking {queued} queued run{'s' if queued != 1 else ''} out of the queue...")


def _by_target(matches: list[Match]) -> tuple[dict[str, Target], dict[str, list[str]]]:
    """The targets to ask, and the run ids to end on each (a run named twice is ended once)."""
    targets: dict[str, Target] = {}
    by_target: dict[str, list[str]] = defaultdict(list)
    for match in matches:
        for target, record in match.runs:
            targets[target.name] = target
            if record.run_id not in by_target[target.name]:
                by_target[target.name].append(record.run_id)
    return targets, by_target


def _print(answers: dict[str, KillAnswer], *, queued: set[str]) -> None:
    """One line per run: how it ended and what survived; a run the agent took out of its queue (`was_queued`;
    an agent before it: one `queued` when it was looked up, killed, with no process) never started."""
    out = stdout()
    for target, answer in answers.items():
        if answer.error and not answer.runs:
            say(out, about(target, answer.error))
        for entry in answer.runs:
            record = entry.record()
            ended = record.ended_text()
            if entry.was_queued or (entry.run_id in queued and record.state == KILLED and record.pid is None):
                ended = "killed while queued; nothing of it had started, and it never will"
            elif entry.already_ended:
                ended = f"had already ended: {ended}; nothing to stop"
            line = f"{entry.run_id} on {target}: {ended}"
            if entry.state_error:
                line += f"; {entry.state_error}"
            for refused in entry.refused:
                line += f"; NOT SIGNALLED: pid {refused.pid}: {refused.reason}"
            if entry.survivors:
                line += "; STILL ALIVE: " + ", ".join(f"{survivor.pid} {(survivor.cmdline or '')[:60]}"
                                                     for survivor in entry.survivors)
            say(out, line)
