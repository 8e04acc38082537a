"""`watch --headless` heals what a supervisor cannot: a run lost with its container (a reboot took the
supervisor too) that has a restart policy with restarts left is started again, once per loss, as a new run of
its command that resumes from its newest checkpoint (the agent's `relaunch`, which also refuses a second
relaunch of the same loss, from this watcher or another). Each relaunch is said as a JSON line and as a
`restarted` alert, which the notification destinations get like any other.
"""
from __future__ import annotations

from collections.abc import Callable

from ..errors import DflashError
from ..alertkinds import ERROR, RESTARTED, WARNING
from ..watch.model import AlertFeed, AlertView, RunStatus
from ..watch.source import LiveSource
from ..agent.protocol import iso_utc


class Relauncher:
    def __init__(self, source: LiveSource, say: Callable[[dict], None]) -> None:
        self.source = source
        self.say = say
        self._tried: set[tuple[str, str]] = set()  # (target, run id): one try per loss from this watcher

    def __call__(self, feed: AlertFeed) -> None:
        for run in feed.runs.values():
            if run.relaunchable and (run.target, run.run_id) not in self._tried:
                self._tried.add((run.target, run.run_id))
                self.relaunch(run)

    def relaunch(self, run: RunStatus) -> None:
        try:
            target = self.source.inventory.target(run.target)
            record = self.source.client.relaunch(target, run.run_id, name=run.name)
        except DflashError as exc:
            self._tell(run, "relaunch_failed", ERROR, f"lost run {run.run_id} not relaunched: {exc}")
            return
        new_id = record.get("run_id")
        self._tell(run, "relaunched", WARNING,
                   f"restarted: lost run {run.run_id} relaunched as {new_id} on {run.target}, resuming from its "
                   f"newest checkpoint", new_run_id=new_id)

    def _tell(self, run: RunStatus, line_type: str, severity: str, message: str, **extra) -> None:
        now = iso_utc(timespec="seconds")
        self.say({"type": line_type, "time": now, "run_id": run.run_id, "target": run.target, "name": run.name,
                  "message": message, **extra})
        self.source.note(AlertView(time=now, run_id=run.run_id, target=run.target, kind=RESTARTED,
                                   severity=severity, message=message))
