"""The GPU row: nvidia-smi's CSV parsed against the real H200 output in shared/fixtures, the wire's JSON object,
and what the agent, the doctor and watch judge of a row (held, idle while held, held by no live run)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_records.gpu import GPU_HELD_MIB, GPU_MEMORY_FIELDS, GpuRow, held_without_run, parse_query_csv

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


def test_a_row_crosses_the_wire_as_every_field_and_comes_back_the_same() -> None:
    (row,) = parse_query_csv("3, GPU-x, NVIDIA H200, 35011, 143771, 0")
    assert row == GpuRow(3, "GPU-x", "NVIDIA H200", 35011, 143771, 0)
    wire = row.to_dict()
    assert list(wire) == ["index", "uuid", "name", "memory_used_mib", "memory_total_mib", "utilization_pct"]
    assert GpuRow.from_dict(wire) == row
    # read with fewer fields (cleanup's query), it says those only, as the agent always has
    assert row.to_dict(GPU_MEMORY_FIELDS) == {"index": 3, "memory_used_mib": 35011, "utilization_pct": 0}
    # an older agent's cleanup row (three fields) and a newer one's (a field this version does not know)
    old = {"index": 0, "memory_used_mib": 5, "utilization_pct": 1}
    assert GpuRow.from_dict(old) == GpuRow(0, memory_used_mib=5, utilization_pct=1)
    assert GpuRow.from_dict({**wire, "temperature_c": 40}) == row
    for bad in ({}, {"index": "0"}, {"index": True}, [wire], None):
        assert GpuRow.from_dict(bad) is None


def test_a_gpu_is_held_from_the_threshold_and_idle_only_at_no_utilisation() -> None:
    held = GpuRow(0, memory_used_mib=GPU_HELD_MIB, utilization_pct=0)
    below = GpuRow(1, memory_used_mib=GPU_HELD_MIB - 1, utilization_pct=0)
    assert held.held and held.idle_and_held and not below.held and not below.idle_and_held
    assert not GpuRow(2, memory_used_mib=80_000, utilization_pct=1).idle_and_held
    assert not GpuRow(3, memory_used_mib=80_000).idle_and_held   # a utilisation not given proves nothing


def test_held_gpus_no_live_run_claims() -> None:
    rows = parse_query_csv("0, 35011, 0\n1, 35011, 90\n2, 10, 0", SEED_FIELDS)
    assert [row.index for row in held_without_run(rows, [])] == [0, 1]
    assert [row.index for row in held_without_run(rows, [[0]])] == [1]
    assert held_without_run(rows, [[0], None]) == []   # a live run without --gpus may use any of them
