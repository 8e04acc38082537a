"""What a launch says besides its run id, so that nobody starts a run twice: the log tail of a run that ended while
it was verified, a run that was started but not seen running in time (left running, exit 3), and the runs an
interrupted launch (Ctrl-C) leaves behind it.
"""
from __future__ import annotations

from typing import NoReturn

import typer

from dflash_records.run import RunRecord
from dflash_records.terminaltext import for_terminal

from ..runs import whereabouts
from ..runs.client import LaunchFailed, RunClient
from .output import stderr

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
TAIL_SHOWN = 40


def report_failure(failed: LaunchFailed, where: str | None = None) -> None:
    """The last lines of the log of a run that ended during its launch (its error line says how it ended)."""
    answer = failed.answer
    run = answer.run
    if run is None:  # refused before anything started (e.g. GPUs busy): the error says it all
        return
    err = stderr()
    lines = answer.log_tail or ()
    if lines:
        on = f" on {where}" if where else ""
        err.print(f"last lines of the log of {run.run_id or '?'}{on}:", markup=False)
        for line in lines[-TAIL_SHOWN:]:  # the workload's text only, never its escape sequences
            err.print(f"  {for_terminal(line)}", markup=False)


def interrupted(client: RunClient | None) -> NoReturn:
    """Ctrl-C during a launch: name every run it asked a target to start (each goes on running, detached from
    this process) and how to stop it, note where each is for that `kill`, and exit 130."""
    started = dict(client.started) if client is not None else {}
    err = stderr()
    if not started:
        err.print("dflashctl: interrupted; no run was started", markup=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    whereabouts.remember((target, RunRecord(run_id=run_id)) for run_id, target in started.items())
    for run_id, target in started.items():
        err.print(f"dflashctl: interrupted: {run_id} was started on {target} and goes on running without "
                  f"dflashctl; `dflashctl kill {run_id}` stops it", markup=False)
    if len(started) > 1:
        err.print(f"`dflashctl kill {' '.join(started)}` stops them all", markup=False)
    raise typer.Exit(EXIT_INTERRUPTED)


__all__ = ["report_failure", "interrupted", "EXIT_INTERRUPTED"]
