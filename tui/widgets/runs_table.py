"""The table of every run of every target, rows keyed by run id and updated in place."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from orchestrator.watchmodel import RunView

from ..runcells import COLUMNS, run_cells


class RunsTable(DataTable):
    DEFAULT_CSS = """
    RunsTable { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._row_keys: list[str] = []
        self._cells: dict[str, dict[str, Text]] = {}

    def on_mount(self) -> None:
        for key, header in COLUMNS:
            self.add_column(header, key=key)

    @property
    def selected_run_id(self) -> str | None:
        if not self._row_keys or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value

    def show_runs(self, runs: Sequence[RunView]) -> None:
        """Show exactly `runs`, in their order; the cursor stays on its run when that run is still shown."""
        keys = [run.run_id for run in runs]
        if keys == self._row_keys:
            for run in runs:
                self._update_row(run)
        else:
            self._rebuild(runs)

    def _update_row(self, run: RunView) -> None:
        old = self._cells[run.run_id]
        new = run_cells(run)
        for column, value in new.items():
            if old.get(column) != value:
                self.update_cell(run.run_id, column, value, update_width=True)
        self._cells[run.run_id] = new

    def _rebuild(self, runs: Sequence[RunView]) -> None:
        selected = self.selected_run_id
        self.clear()
        self._row_keys = [run.run_id for run in runs]
        self._cells = {}
        for run in runs:
            cells = run_cells(run)
            self._cells[run.run_id] = cells
            self.add_row(*(cells[key] for key, _ in COLUMNS), key=run.run_id)
        if selected in self._cells:
            self.move_cursor(row=self.get_row_index(selected), animate=False)
