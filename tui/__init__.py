"""The `dflashctl watch` Textual dashboard."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.watch.model import DashboardSource


def run_dashboard(source: DashboardSource, *, refresh_s: float = 0.5, kill_grace_s: float | None = None) -> None:
    """Run the dashboard on `source` until the user quits, then close the source. A kill from it waits the
    run's own grace (recorded at launch) unless `kill_grace_s` is given."""
    # Imported here so that `dflashctl --help` and `watch --once` never pay for loading Textual.
    from .app import DashboardApp

    try:
        DashboardApp(source, refresh_s=refresh_s, kill_grace_s=kill_grace_s).run()
    finally:
        source.close()
