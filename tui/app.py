"""`DashboardApp`: composes the screens, follows the data source in a worker, and runs kill and cleanup."""
from __future__ import annotations

import time
from collections.abc import Callable

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.worker import get_current_worker

from dflash_records.protocol import TERMINAL_STATES
from orchestrator.watch.model import ActionResult, DashboardSource

from .cancellable import sleep_unless_cancelled
from .messages import (ActionFinished, CleanupRequested, KillRequested, LogRequested, SnapshotUpdated,
                       SourceFailed)
from .runcells import run_label
from .screens.cleanup_confirm import CleanupConfirmScreen
from .screens.confirm import ConfirmScreen
from .screens.help_screen import HelpScreen, HelpSection
from .screens.kill_confirm import KillConfirmScreen, kill_grace
from .screens.log_screen import LogScreen
from .screens.main_screen import MainScreen
from .widgets.filter_bar import FilterBar
from .widgets.log_view import LogView
from .widgets.runs_table import RunsTable

# How long one wait_for_change may block: bounds how late the worker notices that the app is closing.
MAX_WAIT_S = 0.5
RETRY_AFTER_ERROR_S = 2.0


class DashboardApp(App):
    """The live dashboard over any DashboardSource; it never does IO on the event loop."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "dflashctl watch"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("question_mark", "help", "Help", key_display="?")]

    def __init__(self, source: DashboardSource, *, refresh_s: float = 0.5, kill_grace_s: float | None = None) -> None:
        """`kill_grace_s`: the grace of every kill from here; None (the default) uses each run's own."""
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.kill_grace_s = kill_grace_s
        self.main_screen = MainScreen()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_sections()))

    def get_default_screen(self) -> MainScreen:
        return self.main_screen

    def on_mount(self) -> None:
        self._follow_source()

    @work(thread=True, exclusive=True, group="source")
    def _follow_source(self) -> None:
        """Post a snapshot now and after every change, at most one per refresh_s; bursts collapse."""
        worker = get_current_worker()
        changed = True
        while not worker.is_cancelled:
            started = time.monotonic()
            try:
                if changed:
                    self.post_message(SnapshotUpdated(self.source.snapshot()))
                changed = self.source.wait_for_change(min(self.refresh_s, MAX_WAIT_S))
            except Exception as error:  # the dashboard outlives a failing source; it shows why and retries
                self.post_message(SourceFailed(f"{type(error).__name__}: {error}"))
                sleep_unless_cancelled(worker, RETRY_AFTER_ERROR_S)
                changed = True
                continue
            rest = self.refresh_s - (time.monotonic() - started)
            if changed and rest > 0:
                sleep_unless_cancelled(worker, rest)

    @on(SnapshotUpdated)
    def _snapshot_updated(self, message: SnapshotUpdated) -> None:
        self.main_screen.show_snapshot(message.snapshot)
        # The app may be closing: its screens went, and the source's worker had posted one more snapshot.
        top = self.screen_stack[-1] if self.screen_stack else None
        if isinstance(top, (LogScreen, KillConfirmScreen)):  # screens of one run follow its newer views
            shown = top.run.run_id
            run = next((run for run in message.snapshot.runs if run.run_id == shown), None)
            if run is not None:
                top.show_run(run)

    @on(SourceFailed)
    def _source_failed(self, message: SourceFailed) -> None:
        self.main_screen.show_source_error(message.error)

    @on(KillRequested)
    def _kill_requested(self, message: KillRequested) -> None:
        run = message.run
        if run.state in TERMINAL_STATES:
            self.notify(f"Run {run_label(run)} has already ended ({run.state})", markup=False)
            return

        grace = kill_grace(run, self.kill_grace_s)  # one value: the prompt names what the kill will use

        def answered(confirmed: bool | None) -> None:
            if confirmed:
                self.notify(f"Killing {run_label(run)} on {run.target}…", markup=False)
                self._run_action("kill", run.run_id, lambda: self.source.kill(run.run_id, grace=grace))

        self.push_screen(KillConfirmScreen(run, grace=grace), answered)

    @on(CleanupRequested)
    def _cleanup_requested(self, message: CleanupRequested) -> None:
        target = message.target
        self.notify(f"Planning the cleanup of {target}…", markup=False)
        self._run_action("cleanup_plan", target, lambda: self.source.cleanup(target, dry_run=True))

    @on(LogRequested)
    def _log_requested(self, message: LogRequested) -> None:
        self.push_screen(LogScreen(self.source, message.run, refresh_s=self.refresh_s))

    @on(ActionFinished)
    def _action_finished(self, message: ActionFinished) -> None:
        result = message.result
        if message.action == "cleanup_plan" and result.ok:
            self._confirm_cleanup(message.subject, result)
            return
        what = {"kill": "Kill of", "cleanup": "Cleanup of", "cleanup_plan": "Cleanup plan for"}[message.action]
        outcome = "done" if result.ok else "FAILED"
        self.notify(f"{what} {message.subject} {outcome}: {result.message}",
                    severity="information" if result.ok else "error", timeout=8, markup=False)

    def _confirm_cleanup(self, target: str, plan: ActionResult) -> None:
        def answered(confirmed: bool | None) -> None:
            if confirmed:
                self.notify(f"Cleaning up {target}…", markup=False)
                self._run_action("cleanup", target, lambda: self.source.cleanup(target, dry_run=False))

        self.push_screen(CleanupConfirmScreen(target, plan), answered)

    @work(thread=True, group="actions")
    def _run_action(self, action: str, subject: str, call: Callable[[], ActionResult]) -> None:
        try:
            result = call()
        except Exception as error:  # reported like a failed result: the dashboard must stay up
            result = ActionResult(ok=False, message=f"{type(error).__name__}: {error}")
        self.post_message(ActionFinished(action, subject, result))


def help_sections() -> list[HelpSection]:
    """What the help screen lists: the bindings of every screen and widget a person types into."""
    return [
        ("Dashboard", (DashboardApp, MainScreen), True),
        ("Runs table", (RunsTable,), True),
        ("Filter bar (/)", (FilterBar,), False),  # not the Input's many editing keys
        ("Full log (l)", (LogScreen, LogView), True),
        ("Kill and cleanup prompts", (ConfirmScreen,), True),
        ("This help", (HelpScreen,), False),
    ]
