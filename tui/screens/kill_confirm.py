"""Asks before a kill, naming the run, its target and the grace before SIGKILL."""
from __future__ import annotations

from rich.text import Text

from orchestrator.watchmodel import RunView

from ..runcells import run_label
from .confirm import ConfirmScreen


class KillConfirmScreen(ConfirmScreen):
    def __init__(self, run: RunView, *, grace: float) -> None:
        super().__init__(kill_question(run, grace), kill_details(run), yes_label="Kill")
        self.run = run
        self.grace = grace


def kill_question(run: RunView, grace: float) -> str:
    return f"Kill run {run_label(run)} on {run.target}? TERM now, KILL after {grace:g} s"


def kill_details(run: RunView) -> Text:
    details = Text()
    details.append(f"state {run.state}")
    if run.phase:
        details.append(f", phase {run.phase}")
    if run.last_step is not None:
        details.append(f", step {run.last_step}")
    if run.pid is not None:
        details.append(f", supervisor pid {run.pid}")
    if run.gpus:
        details.append(f", GPUs {','.join(str(gpu) for gpu in run.gpus)}")
    details.append("\nEvery process of the run gets SIGTERM; what is left after the grace gets SIGKILL.")
    return details
