"""Table cells of a run: what a person reads in the runs table."""
from __future__ import annotations

import pytest

from orchestrator.watchmodel import RunView
from tui.runcells import MISSING, run_cells


@pytest.mark.parametrize("state, eta", [("running", "1h00m"), ("killed", MISSING), ("succeeded", MISSING),
                                        ("lost", MISSING)])
def test_eta_only_for_runs_still_going(state: str, eta: str) -> None:
    cells = run_cells(RunView(run_id="r1", target="pve1/200", name="r1", state=state, eta_s=3600.0, last_step=7))
    assert cells["eta"].plain.strip() == eta
    assert cells["step"].plain.strip() == "7"
