"""Fixtures of the CLI tests on `local`."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.workloads import stop_keeper, write_local_inventory


@pytest.fixture
def inv(tmp_path: Path):
    """An inventory of `local` working under tmp_path; the keeper its launches started is stopped afterwards."""
    yield write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    stop_keeper(tmp_path / "work" / ".dflash" / "runs")
