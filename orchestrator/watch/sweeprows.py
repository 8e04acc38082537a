"""A sweep's runs on the dashboard: side by side, where its first run sorts, best first by the rule `sweep report`
ranks by (runs/sweep.rank_key: the newest held-out τ, then tok/s), each with its rank in the sweep."""
from __future__ import annotations

from dataclasses import replace

from ..runs.sweep import rank_key
from .model import RunView


def group_sweeps(rows: list[RunView]) -> list[RunView]:
    """The rows in their order, each sweep's runs gathered at its first one's place and ranked."""
    members: dict[str, list[RunView]] = {}
    for row in rows:
        if row.sweep_id:
            members.setdefault(row.sweep_id, []).append(row)
    out: list[RunView] = []
    for row in rows:
        if not row.sweep_id:
            out.append(row)
        elif row.sweep_id in members:  # its first run: the whole sweep goes here
            ranked = sorted(members.pop(row.sweep_id), key=lambda v: rank_key(v.tau_heldout, v.tok_per_s, v.run_id))
            out += [replace(view, sweep_rank=rank) for rank, view in enumerate(ranked, start=1)]
    return out
