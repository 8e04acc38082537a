"""The seed run's real log lines (shared/fixtures/logs/), copied verbatim into the repo for every test to read."""
from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "lab" / "fixtures" / "logs"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "logs"  # beside a checkout, if there

SEED_STARTUP = (FIXTURES / "seed_startup.log").read_text()
SEED_STEPS = (FIXTURES / "seed_steps.log").read_text()
