"""Shows what a cleanup of a target would do (its dry run) and asks before doing it."""
from __future__ import annotations

from rich.text import Text

from dflash_records.plans import CleanupAnswer
from orchestrator.display import clip
from orchestrator.watch.model import ActionResult

from .confirm import ConfirmScreen

LINE_CHARS = 240  # an action's line names a command line, which may be as long as a workload likes


class CleanupConfirmScreen(ConfirmScreen):
    """The plan and a confirm button; when the dry run planned nothing, only that (and what it cannot fix)."""

    def __init__(self, target: str, plan: ActionResult) -> None:
        if planned_actions(plan):
            super().__init__(f"Clean up {target}? This is what it would do:", plan_text(plan), yes_label="Clean up")
        else:
            super().__init__(f"Nothing to clean on {target}.", plan_text(plan), yes_label=None)
        self.target = target
        self.plan = plan


def planned_actions(plan: ActionResult) -> tuple:
    return plan.cleanup.actions if plan.cleanup else ()


def plan_text(plan: ActionResult) -> Text:
    """The dry run's message, its planned actions, what it cannot fix, and the zombies of processes no run owns
    (never planned: cleanup ends only what its runs left), each in the words `dflashctl cleanup` prints."""
    answer = plan.cleanup or CleanupAnswer()
    if answer.actions:
        text = Text(plan.message or "")
        text.append(f"\n\nPlanned actions ({len(answer.actions)}):", style="bold")
    else:  # the title says there is nothing to clean: here only what was looked for, once
        text = Text("No orphan of an ended run (stuck or not), no dead run.", style="dim")
    for action in answer.actions:
        text.append("\n  • ")
        text.append(clip(action.shown(), LINE_CHARS))
    if answer.findings:
        text.append(f"\n\nCannot fix from here ({len(answer.findings)}):", style="bold yellow")
        for finding in answer.findings:
            text.append("\n  • ")
            text.append(clip(finding.shown(), LINE_CHARS), style="yellow")
    if answer.foreign_zombies:
        text.append(f"\n\nNot ours, left alone ({len(answer.foreign_zombies)}):", style="bold yellow")
        for entry in answer.foreign_zombies:
            text.append("\n  • ")
            text.append(clip(entry.description, LINE_CHARS), style="yellow")
        for advice in answer.foreign_advice():
            text.append(f"\n  {advice}", style="yellow")
    return text
