"""`dflashctl logs RUN [-f] [-n N]`."""
from __future__ import annotations

import sys
import time
from typing import Optional

import typer

from ..agent.protocol import TERMINAL_STATES
from ..errors import EXIT_FAILED, EXIT_OK, CommandTimeout, TargetNotFound
from ..runs.addressing import Match, locate
from ..runs.client import RunClient
from ..transports.pool import Connections
from .output import stderr
from .state import AppState

STATE_POLL_S = 2.0


def logs(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN",
                                 help="A run or job id, a unique prefix of one, or the name given at launch "
                                      "(its newest run, live ones first)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run ends."),
    lines: int = typer.Option(100, "--lines", "-n", min=0, help="How many of the last lines to show first."),
    node: Optional[int] = typer.Option(None, "--node", min=0,
                                       help="Of a job: this node's log (default: node 0, which holds rank 0)."),
) -> int:
    """Print the end of a run's log (its stdout and stderr); with -f, follow it until the run ends.

    For a multi-node job, the log of node 0 (rank 0's step lines are the job's), or of --node N.
    """
    state: AppState = ctx.obj
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        match = locate(client, [run_id])[0]
        if match.note:
            stderr().print(match.note, markup=False)
        target, record = _pick(match, node)
        run_id = record["run_id"]
        transport = conns.for_target(target)
        log_path = record["log_path"]
        if not follow:
            result = transport.run(["tail", "-n", str(lines), "--", log_path], timeout=60)
            sys.stdout.buffer.write(result.stdout)
            sys.stdout.flush()
            return EXIT_OK if result.ok else EXIT_FAILED
        return _follow(client, transport, target, run_id, log_path, lines)


def _pick(match: Match, node: int | None) -> tuple:
    """The one run to show: the run itself, or the chosen node of a job."""
    if match.kind == "run":
        return match.runs[0]
    nodes = {rec.get("node_rank"): (target, rec) for target, rec in match.runs}
    rank = 0 if node is None else node
    if rank not in nodes:
        raise TargetNotFound(f"job {match.id} has no node {rank} (nodes: {', '.join(map(str, sorted(nodes)))})")
    return nodes[rank]


def _follow(client: RunClient, transport, target, run_id: str, log_path: str, lines: int) -> int:
    """tail -F until the run is in a terminal state (checked every few seconds), then drain and stop."""
    proc = transport.start(["tail", "-n", str(lines), "-F", "--", log_path])
    ended_at: float | None = None
    next_check = time.monotonic() + STATE_POLL_S
    try:
        while True:
            try:
                chunk = proc.read(timeout=0.5)
            except CommandTimeout:
                chunk = None
            if chunk == b"":
                return EXIT_OK
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            if ended_at is not None and time.monotonic() - ended_at > 1.0:
                return EXIT_OK  # the run ended and its last output has had time to arrive
            if ended_at is None and time.monotonic() >= next_check:
                next_check = time.monotonic() + STATE_POLL_S
                if any(r.get("state") in TERMINAL_STATES for r in client.runs_on(target, [run_id])):
                    ended_at = time.monotonic()
    finally:
        proc.close()
