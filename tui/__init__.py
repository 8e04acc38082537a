"""The `dflashctl watch` Textual dashboard."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.watchmodel import DashboardSource


def run_dashboard(source: DashboardSource, *, refresh_s: float = 0.5, kill_grace_s: float = 30.0) -> None:
    """Run the dashboard on `source` until the user quits, then close the source."""
    # Imported here so that `dflashctl --help` and `watch --once` never pay for loading Textual.
    from .app import DashboardApp

    try:
        DashboardApp(source, refresh_s=refresh_s, kill_grace_s=kill_grace_s).run()
    finally:
        source.close()
