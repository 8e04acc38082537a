"""Asks before a kill, naming the run, its target and the grace before SIGKILL."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from dflash_records.protocol import DEFAULT_GRACE_S, QUEUED
from orchestrator.display import state_text
from orchestrator.watch.model import RunView

from ..runcells import run_label
from .confirm import ConfirmScreen


class KillConfirmScreen(ConfirmScreen):
    def __init__(self, run: RunView, *, grace: float) -> None:
        super().__init__(kill_question(run, grace), kill_details(run), yes_label="Kill")
        self.run = run
        self.grace = grace

    def show_run(self, run: RunView) -> None:
        """A newer view of the run while the prompt is open: its step and state as they are now."""
        if kill_details(run) != kill_details(self.run):
            self.query_one("#details-text", Static).update(kill_details(run))
        self.run = run


def kill_grace(run: RunView, override: float | None = None) -> float:
    """The grace a kill from the dashboard uses, and so the one its prompt names: the dashboard's override,
    else the grace the run recorded at launch, else the default the agent itself would use."""
    if override is not None:
        return override
    return DEFAULT_GRACE_S if run.grace_s is None else run.grace_s


def kill_question(run: RunView, grace: float) -> str:
    if run.state == QUEUED:  # nothing of it runs: the kill takes it out of the queue, and it never starts
        return f"Kill queued run {run_label(run)} on {run.target}? It leaves the queue and never starts"
    return f"Kill run {run_label(run)} on {run.target}? TERM now, KILL after {grace:g} s"


def kill_details(run: RunView) -> Text:
    details = Text()
    if run.state == QUEUED:
        details.append(f"{state_text(run.state, position=run.queue_position)}, waiting for {run.waits_for}")
        return details
    details.append(f"state {run.state}")
    if run.phase:
        details.append(f", phase {run.phase}")
    if run.last_step is not None:
        details.append(f", step {run.last_step}")
    if run.pid is not None:
        details.append(f", workload pid {run.pid}")  # the record's pid: what the supervisor started
    if run.gpus:
        details.append(f", GPUs {','.join(str(gpu) for gpu in run.gpus)}")
    details.append("\nEvery process of the run gets SIGTERM; what is left after the grace gets SIGKILL.")
    return details
