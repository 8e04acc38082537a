"""`dflashctl logs RUN [-f] [-n N]`."""
from __future__ import annotations

import sys
import time
from typing import Optional

import typer

from dflash_records.protocol import TERMINAL_STATES
from dflash_records.terminaltext import TerminalStream

from ..errors import EXIT_OK, CommandTimeout, DflashError, OperationFailed, TargetNotFound, UsageError
from ..runs.addressing import Match, locate
from ..runs.client import RunClient
from ..transports.pool import Connections
from ..transports.timeouts import LOG_READ_TIMEOUT_S
from ..watch.stream import drop_connection, reason_only
from .args import number_in
from .output import stderr
from .state import AppState

STATE_POLL_S = 2.0
READ_WAIT_S = 0.5  # one read of the followed stream waits at most this long: the run's state is still polled
RECONNECT_FIRST_S = 1.0
RECONNECT_CAP_S = 5.0  # an operator following a log wants it back soon after the Wi-Fi is
MAX_LINES = 10**12  # far beyond any log, and within what every tail (GNU's, busybox's) can count


def logs(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN",
                                 help="A run or job id, a unique prefix of one, or the name given at launch "
                                      "(its newest run, live ones first)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run ends."),
    lines: int = typer.Option(100, "--lines", "-n", callback=number_in(0, MAX_LINES), metavar="N",
                              help=f"How many of the last lines to show first (up to {MAX_LINES})."),
    node: Optional[int] = typer.Option(None, "--node", callback=number_in(0), metavar="N",
                                       help="Of a job: this node's log (default: node 0, which holds rank 0)."),
) -> int:
    """Print the end of a run's log (its stdout and stderr); with -f, follow it until the run ends.

    What the workload wrote reaches the terminal as text: its escape sequences (clipboard, title, cursor,
    screen clears) are dropped, its colours kept only when stdout is a terminal.

    For a multi-node job, the log of node 0 (rank 0's step lines are the job's), or of --node N.
    """
    state: AppState = ctx.obj
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        match = locate(client, [run_id])[0]
        if match.note:
            stderr().print(match.note, markup=False)
        target, run = _pick(match, node)
        run_id, log_path = run.run_id, run.log_path
        transport = conns.for_target(target)
        if not follow:
            result = transport.run(["tail", "-n", str(lines), "--", log_path], timeout=LOG_READ_TIMEOUT_S)
            _write(_terminal_stream().feed(result.stdout, final=True))
            if not result.ok:  # never a silent exit 1
                raise OperationFailed(f"{target.name}: cannot read the log {log_path}: {result.describe()}")
            return EXIT_OK
        follower = _Follower(client, target, run_id, log_path)
        follower.start_from_tail(transport, lines)
        return follower.run(transport)


def _pick(match: Match, node: int | None) -> tuple:
    """The one run to show, (target, its RunRecord): the run itself, or the chosen node of a job."""
    if match.kind == "run":
        return match.runs[0]
    nodes = {run.node_rank: (target, run) for target, run in match.runs}
    rank = 0 if node is None else node
    if rank not in nodes:
        raise TargetNotFound(f"job {match.id} has no node {rank} (nodes: {', '.join(map(str, sorted(nodes)))})")
    return nodes[rank]


class _Follower:
    """`logs -f`: print from a byte offset with `tail -c +N -F`; when the link drops, say so on stderr, reconnect
    with backoff and resume at the byte where printing stopped (no line lost or repeated). Ends once the run has
    ended and its last output has had time to arrive; never while it is live (Ctrl-C ends it)."""

    def __init__(self, client: RunClient, target, run_id: str, log_path: str) -> None:
        self.client, self.target, self.run_id, self.log_path = client, target, run_id, log_path
        self.offset = 0  # the next byte of the log to print
        self.ended_at: float | None = None
        self.text = _terminal_stream()  # one for the whole follow: a sequence cut between two reads is held

    def start_from_tail(self, transport, lines: int) -> None:
        """Print the last `lines` lines of what is there now and remember where that ends."""
        script = 'n=$(($(wc -c < "$1" 2>/dev/null || echo 0))); echo "$n"; head -c "$n" -- "$1" | tail -n "$2"'
        result = transport.run(["sh", "-c", script, "sh", self.log_path, str(lines)],
                               timeout=LOG_READ_TIMEOUT_S)
        size, _, text = result.stdout.partition(b"\n")
        self.offset = int(size or 0)
        _write(self.text.feed(text))

    def run(self, transport) -> int:
        failures = 0
        while True:
            try:
                transport = transport or self.client.conns.for_target(self.target)
                if self._session(transport):
                    return EXIT_OK
                failures = 0
            except UsageError:
                raise  # the run is gone (its directory removed): nothing to wait for
            except DflashError as exc:
                failures += 1
                stderr().print(f"{self.target.name}: {reason_only(str(exc), self.target.name)}; reconnecting...",
                               markup=False)
                if transport is not None:
                    drop_connection(transport)
            time.sleep(min(RECONNECT_CAP_S, RECONNECT_FIRST_S * 2 ** max(0, failures - 1)))
            self.client.conns.reset(self.target.host.name)
            transport = None  # a new connection at the next attempt

    def _session(self, transport) -> bool:
        """Follow until the run ended (True) or the stream ended while it is live (False); raise on a lost link."""
        proc = transport.start(["tail", "-c", f"+{self.offset + 1}", "-F", "--", self.log_path])
        next_check = time.monotonic() + STATE_POLL_S
        try:
            while True:
                try:
                    chunk = proc.read(timeout=READ_WAIT_S)
                except CommandTimeout:
                    chunk = None
                if chunk:
                    _write(self.text.feed(chunk))
                    self.offset += len(chunk)
                if self.ended_at is not None and time.monotonic() - self.ended_at > 1.0:
                    _write(self.text.feed(b"", final=True))
                    return True  # the run ended and its last output has had time to arrive
                if chunk == b"":
                    return self._ended()
                if self.ended_at is None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + STATE_POLL_S
                    if self._ended():
                        self.ended_at = time.monotonic()
        finally:
            proc.close()

    def _ended(self) -> bool:
        return any(record.state in TERMINAL_STATES for record in self.client.runs_on(self.target, [self.run_id]))


def _terminal_stream() -> TerminalStream:
    """The log's bytes made safe for stdout: colours only where a terminal shows them."""
    return TerminalStream(colours=sys.stdout.isatty())


def _write(text: str) -> None:
    sys.stdout.buffer.write(text.encode("utf-8", "replace"))
    sys.stdout.flush()
