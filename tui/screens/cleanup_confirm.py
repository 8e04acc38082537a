"""Shows what a cleanup of a target would do (its dry run) and asks before doing it."""
from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text

from orchestrator.display import clip
from orchestrator.watch.model import ActionResult

from .confirm import ConfirmScreen

# Fields that name what an action or finding is about, in the order they read best.
SUBJECT_FIELDS = ("pid", "run_id", "count", "pids", "gpus", "cmdline")


class CleanupConfirmScreen(ConfirmScreen):
    """The plan and a confirm button; when the dry run planned nothing, only that (and what it cannot fix)."""

    def __init__(self, target: str, plan: ActionResult) -> None:
        if planned_actions(plan):
            super().__init__(f"Clean up {target}? This is what it would do:", plan_text(plan), yes_label="Clean up")
        else:
            super().__init__(f"Nothing to clean on {target}.", plan_text(plan), yes_label=None)
        self.target = target
        self.plan = plan


def planned_actions(plan: ActionResult) -> list:
    return list(plan.details.get("actions") or [])


def plan_text(plan: ActionResult) -> Text:
    """The dry run's message, its planned actions, what it cannot fix, and the zombies of processes no run owns
    (never planned: cleanup ends only what its runs left)."""
    actions = planned_actions(plan)
    findings = list(plan.details.get("findings") or [])
    foreign = list(plan.details.get("foreign_zombies") or [])
    if actions:
        text = Text(plan.message or "")
        text.append(f"\n\nPlanned actions ({len(actions)}):", style="bold")
    else:  # the title says there is nothing to clean: here only what was looked for, once
        text = Text("No orphan of an ended run (stuck or not), no dead run.", style="dim")
    for action in actions:
        text.append("\n  • ")
        text.append(describe(action, name_field="action"))
    if findings:
        text.append(f"\n\nCannot fix from here ({len(findings)}):", style="bold yellow")
        for finding in findings:
            text.append("\n  • ")
            text.append(describe(finding, name_field="kind"), style="yellow")
    if foreign:
        text.append(f"\n\nNot ours, left alone ({len(foreign)}):", style="bold yellow")
        for entry in foreign:
            text.append("\n  • ")
            text.append(str(entry.get("description") or entry) if isinstance(entry, Mapping) else str(entry),
                        style="yellow")
        for advice in dict.fromkeys(entry.get("advice") for entry in foreign
                                    if isinstance(entry, Mapping) and entry.get("advice")):
            text.append(f"\n  {advice}", style="yellow")  # the same for every parent: said once
    return text


def describe(entry: object, *, name_field: str) -> str:
    """One line for an action or finding, a dict as the cleanup reports them (or already a string)."""
    if not isinstance(entry, Mapping):
        return str(entry)
    parts = [str(entry.get(name_field, "?"))]
    parts += [f"{field} {_short(entry[field])}" for field in SUBJECT_FIELDS if entry.get(field) not in (None, "")]
    reason = entry.get("detail") or entry.get("advice")
    if reason:
        parts.append(f"— {reason}")
    return " ".join(parts)


def _short(value: object, limit: int = 60) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    return clip(str(value), limit)
