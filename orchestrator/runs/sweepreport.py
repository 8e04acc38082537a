"""A sweep's table: each run's grid values, its newest τ figures (chain: tau_heldout; tree: tau_tree_heldout), its
last step, tok/s and state, best first (sweep.rank_key). Pure: records and the tails the agent sent come in.

The τ figures are the newest ones a run logged (an evaluation runs every eval_every steps, so the last step line
often has none): read from its log's end, each step's figures from its metrics.jsonl record where one came
(stepfigures.with_exact, the rule of every view).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_records.run import RunRecord
from dflash_records.stepfigures import exact_records, with_exact

from ..trainlog.parser import StepEvent, step_events
from .sweep import rank_key, value_text

REPORT_TAIL_BYTES = 64 * 1024   # of each run's log: enough step lines to hold the newest evaluation's


@dataclass(frozen=True)
class SweepRow:
    run: RunRecord
    last_step: int | None = None
    tok_per_s: float | None = None
    tau_heldout: float | None = None
    tau_tree_heldout: tuple[tuple[int, float], ...] = ()

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.run.sweep_values or {})

    def rank_key(self) -> tuple:
        return rank_key(self.tau_heldout, self.tok_per_s, self.run.run_id)

    def to_dict(self, keys: list[str]) -> dict:
        return {"run_id": self.run.run_id, "name": self.run.name, "target": self.run.target,
                "state": self.run.state, "values": {key: self.values.get(key) for key in keys},
                "last_step": self.last_step, "tau_heldout": self.tau_heldout,
                "tau_tree_heldout": {str(budget): tau for budget, tau in self.tau_tree_heldout},
                "tok_per_s": self.tok_per_s}


def sweep_row(record: RunRecord, log_tail: str | None, metrics_tail: str | None) -> SweepRow:
    """A run's row from its record and the ends of its log and metrics.jsonl."""
    exact = exact_records(metrics_tail, StepEvent)
    steps = [with_exact(event, exact.get(event.step)) for event in step_events(log_tail) if event.total is None]
    if not steps:  # no step line read: the records alone
        steps = [exact[step] for step in sorted(exact)]
    figures: dict[str, Any] = {}
    for step in steps:  # oldest first: each figure the newest that was logged
        for name in ("step", "tok_per_s", "tau_heldout", "tau_tree_heldout"):
            value = getattr(step, name)
            if value is not None:
                figures[name] = value
    return SweepRow(record, last_step=figures.get("step", record.last_step),
                    tok_per_s=figures.get("tok_per_s", record.tok_per_s), tau_heldout=figures.get("tau_heldout"),
                    tau_tree_heldout=tuple(figures.get("tau_tree_heldout") or ()))


def ranked(rows: list[SweepRow]) -> list[SweepRow]:
    return sorted(rows, key=SweepRow.rank_key)


def differing_keys(rows: list[SweepRow]) -> list[str]:
    """The grid's keys whose values differ among these runs, in the order the sweep set them."""
    keys: list[str] = []
    for row in rows:
        keys += [key for key in row.values if key not in keys]
    return [key for key in keys if len({value_text(row.values.get(key)) for row in rows}) > 1]


def tree_text(pairs: tuple[tuple[int, float], ...]) -> str:
    """`8:2.41 32:2.93`: the tree τ at each node budget."""
    return " ".join(f"{budget}:{tau:.2f}" for budget, tau in pairs) or "-"


def table_rows(rows: list[SweepRow], keys: list[str]) -> tuple[list[str], list[list[str]]]:
    """The header and the cells of the report's table, best run first."""
    header = ["#", "RUN", *keys, "STATE", "STEP", "τ CHAIN", "τ TREE", "TOK/S", "TARGET"]
    cells = []
    for rank, row in enumerate(rows, start=1):
        cells.append([str(rank), row.run.run_id, *(value_text(row.values.get(key)) for key in keys),
                      row.run.state or "-", "-" if row.last_step is None else str(row.last_step),
                      "-" if row.tau_heldout is None else f"{row.tau_heldout:.3f}", tree_text(row.tau_tree_heldout),
                      "-" if row.tok_per_s is None else f"{row.tok_per_s:.0f}", row.run.target or "-"])
    return header, cells


def markdown(header: list[str], cells: list[list[str]]) -> str:
    def line(parts: list[str]) -> str:
        return "| " + " | ".join(part.replace("|", "\\|") for part in parts) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(row) for row in cells)])


__all__ = ["SweepRow", "sweep_row", "ranked", "differing_keys", "table_rows", "markdown", "REPORT_TAIL_BYTES"]
