"""Messages between the dashboard's workers, screens and app. Small dataclasses; bursts collapse."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from orchestrator.watch.model import ActionResult, RunView, Snapshot


@dataclass
class SnapshotUpdated(Message):
    """The source has a new snapshot; only the newest one pending matters."""

    snapshot: Snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotUpdated)


@dataclass
class SourceFailed(Message):
    """Reading the source raised; the worker keeps retrying."""

    error: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SourceFailed)


@dataclass
class ActionFinished(Message):
    """A kill or cleanup call returned. `action` is kill, cleanup_plan or cleanup; `subject` a run id or target."""

    action: str
    subject: str
    result: ActionResult


@dataclass
class KillRequested(Message):
    run: RunView


@dataclass
class CleanupRequested(Message):
    target: str


@dataclass
class LogRequested(Message):
    run: RunView


@dataclass
class LogLineCount(Message):
    """How many lines the log of the run on the full-log screen has now."""

    run_id: str
    count: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LogLineCount) and message.run_id == self.run_id


@dataclass
class LogLinesLoaded(Message):
    """Lines [start, start + len(lines)) of a run's log, as the source returned them."""

    run_id: str
    start: int
    lines: list[str]


@dataclass
class LogFetchFailed(Message):
    """Asking the source for a log's line count or lines raised."""

    error: str
