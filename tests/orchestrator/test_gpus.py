"""nvidia-smi parsing against the real H200 output in shared/fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.gpus import parse_query_csv

# copies of the real H200 output that the lab's fake nvidia-smi is checked against byte for byte
FIXTURES = Path(__file__).resolve().parents[1] / "lab" / "fixtures"
SEED_FIELDS = ("index", "memory.used", "utilization.gpu")
FULL_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "utilization.memory",
               "temperature.gpu", "power.draw", "clocks.sm")

def test_seed_8gpu_query_with_units() -> None:
    gpus = parse_query_csv((FIXTURES / "seed_nvidia_smi_8gpu.csv").read_text(), SEED_FIELDS)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[1].memory_used_mib == 96779 and all(g.utilization_pct == 0 for g in gpus)


@pytest.mark.parametrize("state, used, util", [("idle", 0, 0), ("held", 19603, 0), ("busy", 1139, 100)])
def test_states_with_header_and_nounits(state: str, used: int, util: int) -> None:
    with_header = parse_query_csv((FIXTURES / "nvidia-smi" / f"{state}_seed_query_header.csv").read_text(), SEED_FIELDS)
    full = parse_query_csv((FIXTURES / "nvidia-smi" / f"{state}_full_nounits.csv").read_text(), FULL_FIELDS)
    assert [(g.memory_used_mib, g.utilization_pct) for g in with_header] == [(used, util)]
    assert (full[0].name, full[0].memory_total_mib, full[0].memory_used_mib) == ("NVIDIA H200", 143771, used)


def test_not_available_and_garbage() -> None:
    text = "0, [N/A], 5\nindex, memory.used\n1, 12 MiB, [Not Supported]\n2, 3\n\n"
    gpus = parse_query_csv(text, SEED_FIELDS)
    assert [(g.index, g.memory_used_mib, g.utilization_pct) for g in gpus] == [(0, None, 5), (1, 12, None)]
