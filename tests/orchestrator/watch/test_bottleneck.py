"""The bottleneck named: the seed's own log and GPU sample, synthetic data-starved and target-bound runs, and the
bundled trainer's exact per-step phase times, each fed through a real RunTracker as the live source does."""
from __future__ import annotations

import pytest

from dflash_records.gpu import GpuRow, parse_query_csv
from dflash_records.run import RunRecord
from orchestrator.trainlog.lines import parse_step_times_line
from orchestrator.watch.bottleneck import RunSignals, diagnose, index_ranges
from orchestrator.watch.model import GpuView
from orchestrator.watch.trackers import RunTracker
from tests.seed_logs import FIXTURES, SEED_STARTUP, SEED_STEPS
from trainer.logformat import format_step_times_line

SEED_FIELDS = ("index", "memory.used", "utilization.gpu")
STEP = ("[{i}m] step={i} loss=5.0 acc=0.2 streak=1.0 lr=1e-4 noise=0.0 | tgt={tgt}b/s dft={dft}b/s (9.0Ktok/s) | "
        "q_pre=[{pre}] q_hs=[{hs}] | epoch~0.01 ETA=3.0d")


def seed_gpus() -> tuple[GpuView, ...]:
    gpus = parse_query_csv((FIXTURES.parent / "seed_nvidia_smi_8gpu.csv").read_text(), SEED_FIELDS)
    return tuple(GpuView("pve1/200", g) for g in gpus)


def gpus_at(*percents: float) -> tuple[GpuView, ...]:
    return tuple(GpuView("pve1/200", GpuRow(i, memory_used_mib=1000.0, memory_total_mib=143771.0, utilization_pct=pct),
                         (pct,) * 5) for i, pct in enumerate(percents))


def fed(log: str, *, state: str = "running", gpus: list[int] | None = None) -> RunTracker:
    run = RunTracker("pve1/200", RunRecord(run_id="r", state=state, gpus=gpus or []), history=100, tail=10)
    run.feed(0, 1, log.encode(), now=0.0)
    return run


def test_seed_run_is_drafter_bound_with_its_queues_and_idle_target_gpus() -> None:
    first = SEED_STEPS.splitlines()[0]
    verdict = fed(SEED_STARTUP + first + "\n").diagnosed_view(seed_gpus()).bottleneck
    assert verdict is not None and verdict.bound_by == "drafter"
    assert verdict.evidence == "drafter-bound: prefetch queue full 50/50, hidden-state queue 15/50, GPUs 0-4 at 0 %"
    # all three seed lines: the hidden-state queue keeps filling (15, 17, 18) and the verdict stays
    later = fed(SEED_STARTUP + SEED_STEPS).diagnosed_view(seed_gpus()).bottleneck
    assert later.bound_by == "drafter" and "hidden-state queue 18/50" in later.evidence


@pytest.mark.parametrize("steps, util, bound_by, evidence", [
    # data-starved: the prefetch queues that were full have drained, every GPU waits
    ([(0.40, 0.45, "50, 50, 50, 50, 50", 40), (0.08, 0.09, "2, 0, 1, 0, 0", 1)], (4, 2, 3, 1, 0, 2, 1, 0), "data",
     "data-bound: prefetch queue empty 0/50, GPUs 0-7 at 0-4 %"),
    # target-bound: batches wait for the target, the drafter's GPUs (after the 5 targets') starve
    ([(0.10, 0.60, "50, 50, 50, 50, 50", 50), (0.11, 0.62, "50, 50, 49, 50, 50", 0)], (99, 98, 100, 97, 99, 0, 0, 0),
     "target", "target-bound: prefetch queue full 50/50, hidden-state queue empty 0/50, GPUs 5-7 at 0 %"),
])
def test_synthetic_data_starved_and_target_bound_runs(steps, util, bound_by, evidence) -> None:
    log = "Loading 5 target models...\n" + "".join(
        STEP.format(i=i, tgt=tgt, dft=dft, pre=pre, hs=hs) + "\n" for i, (tgt, dft, pre, hs) in enumerate(steps, 1))
    verdict = fed(log).diagnosed_view(gpus_at(*util)).bottleneck
    assert (verdict.bound_by, verdict.evidence) == (bound_by, evidence)


def test_a_half_full_hidden_state_queue_defers_to_the_batch_rates() -> None:
    signals = RunSignals(tgt_bps=0.2, dft_bps=0.5, q_pre=(50,), q_hs=(20,), queue_capacity=50)
    assert diagnose(signals, ()).bound_by == "target"
    assert diagnose(RunSignals(tgt_bps=0.5, dft_bps=0.5, q_pre=(50,), q_hs=(20,), queue_capacity=50), ()) is None


@pytest.mark.parametrize("times, bound_by, lead", [
    (dict(data=0.002, target=0.050, drafter=0.300, optimizer=0.010, comm=None), "drafter",
     "drafter fwd/bwd+optimizer 310 ms of a 380 ms step (82 %)"),
    (dict(data=0.400, target=0.050, drafter=0.100, optimizer=0.010, comm=None), "data",
     "data wait 400 ms of a 580 ms step (69 %)"),
    (dict(data=0.001, target=0.050, drafter=0.100, optimizer=0.010, comm=0.200), "communication",
     "all-reduce 200 ms of a 380 ms step (53 %)"),
    (dict(data=0.001, target=0.050, drafter=0.060, optimizer=0.010, comm=None), "host",
     "host (GPU idle) 259 ms of a 380 ms step (68 %)"),
])
def test_the_bundled_trainers_phase_times_decide_exactly(times, bound_by, lead) -> None:
    wall = 0.58 if bound_by == "data" else 0.38
    line = format_step_times_line(times, wall_s=wall)
    assert parse_step_times_line(line) == {k: v for k, v in times.items() if v is not None} | {"wall": wall}
    step = STEP.format(i=4, tgt=20.0, dft=3.0, pre="2", hs="")  # its own rates would say drafter, and no queue
    verdict = fed(f"{step}\n{line}\n", gpus=[0, 1]).diagnosed_view(gpus_at(90, 40, 0)).bottleneck
    assert verdict.bound_by == bound_by
    label = "host-bound (GPU idle)" if bound_by == "host" else f"{bound_by}-bound"
    assert verdict.evidence.startswith(f"{label}: {lead}, ") and verdict.evidence.endswith("GPUs 0-1 at 40-90 %")


def test_nothing_to_go_on_is_no_verdict_and_idle_gpus_alone_are_host_bound() -> None:
    assert fed("hello\n").diagnosed_view(gpus_at(80, 90)).bottleneck is None
    idle = fed("hello\n").diagnosed_view(gpus_at(0, 1)).bottleneck
    assert idle.bound_by == "host" and idle.evidence == ("host-bound (GPU idle): nothing in the log names a stage, "
                                                         "GPUs 0-1 at 0-1 %")


def test_ended_runs_are_not_diagnosed_and_unchanged_views_are_reused() -> None:
    log = SEED_STARTUP + SEED_STEPS
    assert fed(log, state="failed").diagnosed_view(seed_gpus()).bottleneck is None
    run, gpus = fed(log), seed_gpus()
    assert run.diagnosed_view(gpus) is run.diagnosed_view(gpus)
    assert run.diagnosed_view(gpus).bottleneck.bound_by == "drafter"


def test_index_ranges() -> None:
    assert index_ranges([4, 0, 1, 2, 3, 6, 9, 10]) == "0-4,6,9-10"
    assert index_ranges([7]) == "7"
