"""`dflashctl pull RUN [--checkpoint latest|step_N|all] [--export] [--to DIR] [--force] [--json]`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..errors import EXIT_OK
from ..runs import pull as pulling
from ..runs.addressing import locate
from ..runs.client import RunClient
from ..runs.fetch import Step, shown
from ..transports.pool import Connections
from ..transports.timeouts import PULL_STALL_S
from .args import number_in
from .output import print_json, say, stderr, stdout
from .state import AppState


def pull(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN",
                                 help="A run or job id, a unique prefix of one, or the name given at launch "
                                      "(its newest run, live ones first). Of a job, node 0's (rank 0 saves)."),
    checkpoint: str = typer.Option("latest", "--checkpoint", "-c", metavar="latest|step_N|all",
                                   help="Which checkpoint: the newest complete one, step_N, or every one kept."),
    export: bool = typer.Option(False, "--export",
                                help="The serving-only copy instead (config.json, bf16 model.safetensors, "
                                     "dflash.py, the model card README.md): made on the target first if it is "
                                     "not there, and loadable with transformers' AutoModel."),
    to: Optional[Path] = typer.Option(None, "--to", metavar="DIR",
                                      help="Where the files go (default: a folder named after the run, in the "
                                           "current one)."),
    force: bool = typer.Option(False, "--force", help="Replace local files that differ from the run's."),
    stall: float = typer.Option(PULL_STALL_S, "--stall", callback=number_in(1), metavar="S",
                                help="Give up on a file after this many seconds without a byte (a dead link)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was pulled as one JSON object."),
) -> int:
    """Copy what a run made to this machine: its checkpoint (or the serving export), its config, metrics.jsonl
    and log, through SSH and `pct exec`.

    Every file is checked against the sha256 the target gives (the trainer's manifest.json for a checkpoint).
    Files already here whole are skipped; a pull that was cut resumes where it stopped (run it again); a
    local file that differs is never replaced without --force. Progress goes to stderr.

    Symbolic links on the target are not followed: a link in a checkpoint is left out, and said.

    Exit codes: 0 pulled, 1 a copy did not verify, a different file is in the way or a file cannot be written
    here (its .part is kept), 2 no such run or checkpoint, or a --to that cannot be a directory, 3 the target
    is unreachable or the link was cut (the next pull resumes).
    """
    state: AppState = ctx.obj
    request = pulling.PullRequest(checkpoint=pulling.check_checkpoint(checkpoint), export=export, to=to,
                                  force=force, stall=stall)
    with Connections() as conns:
        client = RunClient(state.inventory(), conns)
        match = locate(client, [run_id])[0]
        if match.note:
            stderr().print(match.note, markup=False)
        target, record = pulling.node_zero(match)
        result = pulling.pull(client, target, record, request, BarProgress())
    if as_json:
        print_json(result.as_dict())
    else:
        fetched = sum(1 for f in result.files if f["action"] != "skip")
        links = f", {len(result.skipped)} link(s) not followed" if result.skipped else ""
        say(stdout(), f"{result.run_id} ({', '.join(result.checkpoints)}{', export' if export else ''}) -> "
                      f"{result.to}: {fetched} file(s) fetched, {len(result.files) - fetched} already here{links}, "
                      f"{result.transferred / 1e6:.1f} MB transferred, all verified (sha256)")
    return EXIT_OK


class BarProgress(pulling.Progress):
    """A rich progress bar on stderr of the bytes that travel, naming the file in flight (as terminal text: the
    workload chose the name, and a name is never read as rich markup)."""

    def __init__(self) -> None:
        self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(), console=stderr(), transient=False)
        self._task = None

    def note(self, text: str) -> None:
        say(stderr(), text)

    def warning(self, text: str) -> None:
        say(stderr(), f"dflashctl: warning: {text}")

    def start(self, total: int, files: int) -> None:
        if not files:  # everything is here already: nothing travels, no bar (and no rate) to show
            return
        self._bar.start()
        self._task = self._bar.add_task(f"{files} file(s)", total=total)

    def file(self, step: Step) -> None:
        self._bar.update(self._task, description=f"{shown(step.file.dest)} ({step.action})")

    def advance(self, count: int) -> None:
        self._bar.advance(self._task, count)

    def done(self) -> None:
        if self._task is not None:
            self._bar.stop()
