"""The table of every run of every target, rows keyed by run id and updated in place."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.reactive import reactive
from textual.widgets import DataTable

from orchestrator.watchmodel import RunView

from ..runcells import MAX_NAME_CHARS, NARROW_NAME_CHARS, columns, newest_run, run_cells, run_names, table_width

SCROLLBAR_CELLS = 2  # kept free for the vertical scrollbar a long table gets


class RunsTable(DataTable):
    DEFAULT_CSS = """
    RunsTable { height: auto; }
    """

    BINDINGS = [Binding("enter", "select_cursor", "Open the run's full log", show=False)]  # MainScreen opens it

    # Fewer columns when all of them would not fit, so that what matters never needs scrolling sideways.
    narrow: reactive[bool] = reactive(False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._row_keys: list[str] = []
        self._cells: dict[str, dict[str, Text]] = {}
        self._runs: tuple[RunView, ...] = ()
        self._among: tuple[RunView, ...] = ()
        self._names: dict[str, str] = {}
        self._chosen = False  # the first rows put the cursor on the newest live run; later ones keep it

    def on_mount(self) -> None:
        self._add_columns()

    def watch_narrow(self) -> None:
        if not self.is_mounted:
            return
        selected = self.selected_run_id
        self.clear(columns=True)
        self._add_columns()
        self._names = self._run_column()
        self._rebuild(self._runs, selected)

    @property
    def selected_run_id(self) -> str | None:
        if not self._row_keys or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value

    def show_runs(self, runs: Sequence[RunView], *, among: Sequence[RunView] = ()) -> None:
        """Show exactly `runs`, in their order; names that repeat `among` all runs (default: `runs`) get the end
        of their id. The cursor stays on its run when that run is still shown; the first runs shown put it on
        the newest live one."""
        self._runs, self._among = tuple(runs), tuple(among) or tuple(runs)
        self._names = self._run_column()
        if self._fit_columns():
            return  # the columns changed: every row was rebuilt
        keys = [run.run_id for run in runs]
        if keys == self._row_keys:
            for run in runs:
                self._update_row(run)
        else:
            self._rebuild(runs, self.selected_run_id)

    def on_resize(self) -> None:
        self._fit_columns()

    def _fit_columns(self) -> bool:
        """Narrow when the full columns would not fit the width; True when that changed (and rebuilt)."""
        width = self.size.width
        if width <= 0:
            return False
        full_names = run_names(self._among, limit=MAX_NAME_CHARS)
        narrow = table_width(self._runs, full_names, padding=self.cell_padding) > width - SCROLLBAR_CELLS
        if narrow == self.narrow:
            return False
        self.narrow = narrow
        return True

    def _add_columns(self) -> None:
        for key, header in columns(narrow=self.narrow):
            self.add_column(header, key=key)

    def _run_column(self) -> dict[str, str]:
        return run_names(self._among, limit=NARROW_NAME_CHARS if self.narrow else MAX_NAME_CHARS)

    def _cells_of(self, run: RunView) -> dict[str, Text]:
        return run_cells(run, name=self._names.get(run.run_id), narrow=self.narrow)

    def _update_row(self, run: RunView) -> None:
        old = self._cells[run.run_id]
        new = self._cells_of(run)
        for column, _ in columns(narrow=self.narrow):
            if old.get(column) != new[column]:
                self.update_cell(run.run_id, column, new[column], update_width=True)
        self._cells[run.run_id] = new

    def _rebuild(self, runs: Sequence[RunView], selected: str | None) -> None:
        self.clear()
        self._row_keys = [run.run_id for run in runs]
        self._cells = {}
        for run in runs:
            cells = self._cells_of(run)
            self._cells[run.run_id] = cells
            self.add_row(*(cells[key] for key, _ in columns(narrow=self.narrow)), key=run.run_id)
        if selected not in self._cells and not self._chosen:
            newest = newest_run(runs)
            selected = None if newest is None else newest.run_id
        if selected in self._cells:
            self.move_cursor(row=self.get_row_index(selected), animate=False)
        self._chosen = self._chosen or bool(runs)
