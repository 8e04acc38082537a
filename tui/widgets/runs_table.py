"""The table of every run of every target, rows keyed by run id and updated in place."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import DataTable

from orchestrator.display import fit_columns, widest_cells
from orchestrator.watch.model import RunView

from ..runcells import MAX_NAME_CHARS, NARROW_NAME_CHARS, columns, newest_run, run_cells, run_names, widest_run_cells


class RunsTable(DataTable):
    DEFAULT_CSS = """
    RunsTable { height: auto; }
    """
    BINDINGS = [Binding("enter", "select_cursor", "Open the run's full log", show=False)]  # MainScreen opens it

    # Every column while they fit (run names cut down to NARROW_NAME_CHARS first), else the columns that matter
    # most: what they show must never need scrolling sideways.
    narrow: reactive[bool] = reactive(False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._row_keys: list[str] = []
        self._cells: dict[str, dict[str, Text]] = {}
        self._runs: tuple[RunView, ...] = ()
        self._among: tuple[RunView, ...] = ()
        self._name_chars = MAX_NAME_CHARS
        self._names: dict[str, str] = {}
        self._chosen = False  # the first rows put the cursor on the newest live run; later ones keep it
        self._tau = False  # the τ column: shown when a run has a τ and the full table has room for it
        self._fit_width: int | None = None  # the width the columns were chosen for
        self._widths: dict[str, int] = {}

    def render_lines(self, crop: Region) -> list[Strip]:
        # The first frame at a new width comes before the Resize event: fitted only then, an 80-column terminal
        # showed the columns chosen for its earlier width (or for none, at start), lr cut by the edge and tok/s
        # and ETA beyond it. A vertical scrollbar that comes with more rows narrows the table too.
        if self.scrollable_content_region.width != self._fit_width:
            self._fit_columns()
        return super().render_lines(crop)

    def watch_narrow(self) -> None:
        if self.is_mounted:
            self._rebuild(self._runs, self.selected_run_id)

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
        self._names = run_names(self._among, limit=self._name_chars)
        if self._fit_columns():
            return  # every row was rebuilt for the new widths
        cells = {run.run_id: self._cells_of(run) for run in runs}
        # in place while every column keeps its width; a value that needs another one rebuilds the table
        if [run.run_id for run in runs] == self._row_keys and self._column_widths(cells) == self._widths:
            for run in runs:
                self._update_row(run.run_id, cells[run.run_id])
        else:
            self._rebuild(runs, self.selected_run_id)

    def _fit_columns(self) -> bool:
        """Choose the columns and the run names' width for the table's width; True when that changed (and every
        row was rebuilt)."""
        width = self.scrollable_content_region.width
        if width <= 0:
            return False  # not laid out yet: its first frame fits it
        self._fit_width = width
        cell = 2 * self.cell_padding
        widths = {**widest_run_cells(self._runs), "run": NARROW_NAME_CHARS}  # names may be cut down to that
        if not any(run.tau is not None for run in self._runs):
            del widths["tau"]
        fitted = fit_columns(widths, width=width, gap=cell, drop=[("tau",)])
        narrow, tau = fitted is None, fitted is not None and "tau" in fitted
        room = width - sum(widths[key] + cell for key in fitted or () if key != "run") - cell
        name_chars = NARROW_NAME_CHARS if narrow else min(room, MAX_NAME_CHARS)
        if (narrow, name_chars, tau) == (self.narrow, self._name_chars, self._tau):
            return False
        self._name_chars, self._tau = name_chars, tau
        self._names = run_names(self._among, limit=name_chars)
        if narrow != self.narrow:
            self.narrow = narrow  # its watcher rebuilds columns and rows
        else:
            self._rebuild(self._runs, self.selected_run_id)
        return True

    def _column_widths(self, cells: dict[str, dict[str, Text]]) -> dict[str, int]:
        """Each shown column's width: its widest cell or header."""
        return widest_cells(dict(columns(narrow=self.narrow, tau=self._tau)), cells.values())

    def _cells_of(self, run: RunView) -> dict[str, Text]:
        return run_cells(run, name=self._names.get(run.run_id), narrow=self.narrow)

    def _update_row(self, run_id: str, new: dict[str, Text]) -> None:
        old = self._cells[run_id]
        for column, _ in columns(narrow=self.narrow, tau=self._tau):
            if old.get(column) != new[column]:
                self.update_cell(run_id, column, new[column])
        self._cells[run_id] = new

    def _rebuild(self, runs: Sequence[RunView], selected: str | None) -> None:
        # Every column gets its width here, from the cells it will hold, never later from DataTable's own
        # measuring: that runs when the table is idle, and a row drawn before it stays drawn at the old width
        # (DataTable caches drawn cells by content, not by width), `3.` for an lr of `3.57e-05`.
        self.clear(columns=True)
        self._row_keys = [run.run_id for run in runs]
        self._cells = {run.run_id: self._cells_of(run) for run in runs}
        self._widths = self._column_widths(self._cells)
        for key, header in columns(narrow=self.narrow, tau=self._tau):
            self.add_column(header, key=key, width=self._widths[key])
        for run in runs:
            cells = self._cells[run.run_id]
            self.add_row(*(cells[key] for key, _ in columns(narrow=self.narrow, tau=self._tau)), key=run.run_id)
        if selected not in self._cells and not self._chosen:
            newest = newest_run(runs)
            selected = None if newest is None else newest.run_id
        if selected in self._cells:
            self.move_cursor(row=self.get_row_index(selected), animate=False)
        self._chosen = self._chosen or bool(runs)
