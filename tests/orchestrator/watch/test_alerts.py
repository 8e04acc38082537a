"""Alert rules, driven by explicit time, real parsed lines and the seed's real nvidia-smi samples."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.watch.alerts import (
    ENDED,
    ERROR,
    EXCEPTION,
    GPU_IDLE,
    INFO,
    NAN,
    STALL,
    STARVATION,
    THROUGHPUT,
    WARNING,
    Alert,
    AlertRules,
    RunHealth,
)
from dflash_records.gpu import GpuRow, parse_query_csv
from orchestrator.trainlog.parser import LogParser, PhaseEvent, parse_lines, parse_step_line
from dflash_records.run import RunRecord
from dflash_records.step import StepRecord, format_step_line

# nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader, verbatim from
# shared/fixtures: the seed's 8-GPU host while its run was stalled, and one H200 running matrix products.
SEED_STALLED_8GPU = """\
0, 88283 MiB, 0 %
1, 96779 MiB, 0 %
2, 88443 MiB, 0 %
3, 96905 MiB, 0 %
4, 76779 MiB, 0 %
5, 46901 MiB, 0 %
6, 48861 MiB, 0 %
7, 47421 MiB, 0 %
"""
BUSY_H200 = "0, 1139 MiB, 100 %\n"
HELD_H200 = "0, 19603 MiB, 0 %\n"
IDLE_H200 = "0, 0 MiB, 0 %\n"
SEED_FIELDS = ("index", "memory.used", "utilization.gpu")
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/fixtures not beside the checkout")
def test_embedded_samples_match_the_shared_fixtures():
    assert (SHARED / "logs" / "seed_nvidia_smi_8gpu.csv").read_text() == SEED_STALLED_8GPU
    for name, text in (("busy", BUSY_H200), ("held", HELD_H200), ("idle", IDLE_H200)):
        assert (SHARED / "nvidia-smi" / f"{name}_seed_query.csv").read_text() == text


def sample(csv_text: str) -> list[GpuRow]:
    return parse_query_csv(csv_text, SEED_FIELDS)


def step(n: int, *, loss: float = 3.0, tok_per_s: float = 11_700.0, q_pre=(50, 50, 50, 49, 50), q_hs=(15,)):
    line = format_step_line(StepRecord(
        elapsed_s=30.0 * n, step=n, loss=loss, acc=0.1, streak=1.0, lr=1e-4, noise=0.0003, tgt_batches_per_s=0.3,
        dft_batches_per_s=0.3, tok_per_s=tok_per_s, q_pre=list(q_pre), q_hs=list(q_hs), epoch=0.01, eta_s=3600))
    return parse_step_line(line, n)


def training(run: RunHealth, *, steps: int = 10, every_s: float = 30.0, start: float = 0.0) -> float:
    """Feeds `steps` healthy steps, one every `every_s`; returns the time of the last."""
    now = start
    for n in range(steps):
        now = start + n * every_s
        assert run.observe_event(step(n), now) == []
    return now


def kinds(alerts: list[Alert]) -> list[str]:
    return [a.kind for a in alerts]


# ------------------------------------------------------------------------------------------ exceptions and ends


def test_each_new_exception_alerts_once_and_repeats_are_folded():
    run = RunHealth("r1")
    events = parse_lines(["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
                          "RuntimeError: Detected that you are using FX", "[1m] next"])
    (alert,) = run.observe_events(events, 100.0)
    assert (alert.time, alert.run_id, alert.kind, alert.severity) == (100.0, "r1", EXCEPTION, ERROR)
    assert "RuntimeError: Detected that you are using FX" in alert.message and "line 1" in alert.message
    assert run.observe_events(events, 130.0) == []  # the same error again from another thread
    assert kinds(run.observe_events(parse_lines(["KeyError: 'x'"]), 131.0)) == [EXCEPTION]
    assert kinds(run.observe_events(events, 200.0)) == [EXCEPTION]  # again, long after


def test_exception_without_a_message_still_says_what_it_was():
    run = RunHealth("r1")
    interrupted = parse_lines(["Traceback (most recent call last):", '  File "t.py", line 9, in <module>',
                               "KeyboardInterrupt"])
    cut_off = parse_lines(["Traceback (most recent call last):", '  File "t.py", line 9, in <module>'])
    assert run.observe_events(interrupted, 1.0)[0].message.endswith(": KeyboardInterrupt")
    assert run.observe_events(cut_off, 2.0)[0].message.endswith(": Traceback (most recent call last):")


@pytest.mark.parametrize("state, severity", [("succeeded", INFO), ("failed", ERROR), ("killed", WARNING),
                                             ("lost", ERROR)])
def test_run_end_alerts_exactly_once(state, severity):
    run = RunHealth("r1")
    assert run.observe_state("starting", 1.0) == [] and run.observe_state("running", 2.0) == []
    (alert,) = run.observe_state(state, 3.0, record=RunRecord(state=state, exit_code=1 if state == "failed" else None))
    assert (alert.kind, alert.severity, alert.time) == (ENDED, severity, 3.0) and state in alert.message
    assert ("exit code 1" in alert.message) == (state == "failed")
    assert run.observe_state(state, 4.0) == [] and run.observe_state("lost", 5.0) == []


# ------------------------------------------------------------------------------------------ stall


def test_stall_after_five_median_intervals_once_until_steps_resume():
    run = RunHealth("r1")
    run.observe_state("running", 0.0)
    last = training(run, every_s=30.0)
    assert run.check(last + 149.0) == []
    (alert,) = run.check(last + 151.0)
    assert alert.kind == STALL and alert.severity == WARNING and "2m31s" in alert.message
    assert run.check(last + 500.0) == []  # still stalled: no second alert
    assert run.observe_event(step(99), last + 510.0) == []
    assert run.check(last + 600.0) == []
    assert kinds(run.check(last + 510.0 + 161.0)) == [STALL]  # stalled again


def test_stall_limit_has_a_floor_and_a_start_up_limit():
    fast = RunHealth("fast")
    last = training(fast, every_s=1.0)
    assert fast.check(last + 100.0) == [] and kinds(fast.check(last + 121.0)) == [STALL]
    starting = RunHealth("starting")
    starting.observe_event(step(1), 0.0)  # one step: no interval known yet (compilation may follow)
    assert starting.check(800.0) == [] and kinds(starting.check(901.0)) == [STALL]


def test_lines_read_in_one_batch_give_no_step_interval():
    run = RunHealth("r1")
    for n in range(100):  # attaching to an old log: every line arrives at the same moment
        run.observe_event(step(n), 50.0)
    assert run.check(50.0 + 800.0) == [] and kinds(run.check(50.0 + 901.0)) == [STALL]


def test_no_stall_before_training_or_after_the_end():
    run = RunHealth("r1")
    run.observe_event(PhaseEvent(1, "Loading 5 target models...", "loading_targets", n_targets=5), 0.0)
    assert run.check(10_000.0) == []
    last = training(run)
    run.observe_state("failed", last + 1.0)
    assert run.check(last + 10_000.0) == []


# ------------------------------------------------------------------------------------------ GPUs


def test_seed_gpus_held_at_zero_utilisation_while_training_raise_one_alert():
    run = RunHealth("seed")
    last = training(run)
    assert run.observe_gpus(sample(SEED_STALLED_8GPU), last) == []  # one sample is not sustained
    assert run.observe_gpus(sample(SEED_STALLED_8GPU), last + 30) == []
    (alert,) = run.observe_gpus(sample(SEED_STALLED_8GPU), last + 60)
    assert alert.kind == GPU_IDLE and alert.severity == WARNING
    assert "GPUs 0,1,2,3,4,5,6,7" in alert.message and "0 % utilisation" in alert.message
    assert f"{(88283 + 96779 + 88443 + 96905 + 76779 + 46901 + 48861 + 47421) / 1024:.1f} GiB" in alert.message
    assert run.observe_gpus(sample(SEED_STALLED_8GPU), last + 90) == []  # debounced


def test_busy_gpu_raises_nothing_and_clears_the_condition():
    run = RunHealth("r1")
    last = training(run)
    for t in range(0, 600, 10):
        assert run.observe_gpus(sample(BUSY_H200), last + t) == []
    for t in (0, 60):
        alerts = run.observe_gpus(sample(HELD_H200), last + 600 + t)
    assert kinds(alerts) == [GPU_IDLE] and "GPU 0 hold 19.1 GiB" in alerts[0].message
    assert run.observe_gpus(sample(BUSY_H200), last + 700) == []  # cleared...
    for t in (0, 30, 61):
        alerts = run.observe_gpus(sample(HELD_H200), last + 800 + t)
    assert kinds(alerts) == [GPU_IDLE]  # ...so a new idle spell alerts again


def test_gpus_idle_while_loading_or_empty_or_not_the_runs_raise_nothing():
    loading = RunHealth("r1")
    for t in range(0, 600, 30):  # memory held at 0 % while targets load is normal
        assert loading.observe_gpus(sample(SEED_STALLED_8GPU), t) == []
    empty = RunHealth("r2")
    last = training(empty)
    for t in range(0, 600, 30):
        assert empty.observe_gpus(sample(IDLE_H200), last + t) == []
    other = RunHealth("r3", gpu_indices=[8, 9])
    last = training(other)
    for t in range(0, 600, 30):
        assert other.observe_gpus(sample(SEED_STALLED_8GPU), last + t) == []


def test_idle_time_counts_from_the_start_of_training():
    run = RunHealth("r1")
    for t in range(0, 300, 30):
        run.observe_gpus(sample(HELD_H200), t)
    run.observe_event(step(1), 300.0)
    assert run.observe_gpus(sample(HELD_H200), 330) == []
    assert kinds(run.observe_gpus(sample(HELD_H200), 361)) == [GPU_IDLE]


# ------------------------------------------------------------------------------------------ log metrics


def test_throughput_far_below_its_trailing_median():
    run = RunHealth("r1")
    now = training(run, steps=30)
    lows = [run.observe_event(step(100 + i, tok_per_s=4_000.0), now + i) for i in range(6)]
    assert [kinds(a) for a in lows] == [[], [], [], [], [THROUGHPUT], []]
    assert "34 % of its trailing median 11.7K tok/s" in lows[4][0].message
    assert run.observe_event(step(200), now + 10) == []  # recovered: cleared
    lows = [run.observe_event(step(300 + i, tok_per_s=4_000.0), now + 20 + i) for i in range(5)]
    assert kinds(lows[-1]) == [THROUGHPUT]


def test_short_dips_and_young_runs_raise_nothing():
    run = RunHealth("r1")
    now = training(run, steps=30)
    for i in range(4):
        assert run.observe_event(step(100 + i, tok_per_s=1_000.0), now + i) == []
    assert run.observe_event(step(200), now + 5) == []
    young = RunHealth("r2")
    for i in range(10):
        young.observe_event(step(i), i)
    assert all(young.observe_event(step(50 + i, tok_per_s=10.0), 20 + i) == [] for i in range(9))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_loss_once_until_finite_again(bad):
    run = RunHealth("r1")
    training(run, steps=3)
    (alert,) = run.observe_event(step(5, loss=bad), 100.0)
    assert alert.kind == NAN and alert.severity == ERROR and str(bad) in alert.message and "step 5" in alert.message
    assert run.observe_event(step(6, loss=bad), 101.0) == []
    assert run.observe_event(step(7), 102.0) == []
    assert kinds(run.observe_event(step(8, loss=bad), 103.0)) == [NAN]


def test_queue_starvation():
    run = RunHealth("r1")
    alerts = [run.observe_event(step(i, q_hs=(0,)), float(i)) for i in range(4)]
    assert [kinds(a) for a in alerts] == [[], [], [STARVATION], []]
    assert "q_hs=[0]" in alerts[2][0].message and "q_pre=[50, 50, 50, 49, 50]" in alerts[2][0].message
    assert run.observe_event(step(10, q_hs=(3,)), 10.0) == []
    half_empty = [run.observe_event(step(20 + i, q_pre=(20, 50), q_hs=(0,)), 20.0 + i) for i in range(5)]
    assert all(a == [] for a in half_empty)  # the prefetch side is not full: the data loader is the bottleneck
    no_hs_queue = RunHealth("r2")
    assert all(no_hs_queue.observe_event(step(i, q_hs=()), float(i)) == [] for i in range(5))
    fixed = RunHealth("r3", rules=AlertRules(prefetch_capacity=64))
    assert all(fixed.observe_event(step(i, q_hs=(0,)), float(i)) == [] for i in range(5))


def test_a_replayed_log_gives_the_same_alerts():
    text = "".join(format_step_line(StepRecord(
        elapsed_s=30.0 * n, step=n, loss=math.nan if n == 40 else 2.0, acc=0.1, streak=1.0, lr=1e-4, noise=0.0,
        tgt_batches_per_s=0.3, dft_batches_per_s=0.3, tok_per_s=11_700.0 if n < 30 else 2_000.0, q_pre=[50],
        q_hs=[15], epoch=0.0, eta_s=None)) + "\n" for n in range(50)) + "ValueError: bad shard\n"

    def replay() -> list[Alert]:
        parser, run, alerts = LogParser(), RunHealth("r1"), []
        for n, line in enumerate(text.encode().splitlines(keepends=True)):
            alerts += run.observe_events(parser.feed(line), float(n))
        return alerts + run.observe_events(parser.flush(), 99.0)

    first = replay()
    assert kinds(first) == [THROUGHPUT, NAN, EXCEPTION] and replay() == first


def test_finished_or_reloading_trainer_is_not_training():
    run = RunHealth("r1")
    last = training(run)
    run.observe_events(parse_lines(["Finished: 10 steps in 300.0s; checkpoint /out/step_10"]), last)
    assert run.phase == "finished" and run.check(last + 10_000.0) == []
    restarted = RunHealth("r2")
    last = training(restarted)
    restarted.observe_events(parse_lines(["Loading dataset from /data..."]), last + 1)
    assert restarted.phase == "loading_dataset" and restarted.check(last + 10_000.0) == []
    for t in (0, 100):
        assert restarted.observe_gpus(sample(HELD_H200), last + t) == []
    restarted.observe_event(step(11), last + 200)
    assert restarted.training and restarted.check(last + 200 + 800) == []  # the start-up limit again


def test_low_disk_fires_once_below_either_mark_and_again_after_recovery() -> None:
    from orchestrator.watch.alerts import LOW_DISK, DiskHealth

    gib = 1024 ** 3
    disk = DiskHealth("pve1/200")
    assert disk.observe(100 * gib, 1000 * gib, 0.0) == []          # 10 %: fine
    first = disk.observe(40 * gib, 1000 * gib, 1.0)                 # 4 % of a big disk, though 40 GiB
    assert [a.kind for a in first] == [LOW_DISK] and first[0].run_id is None
    assert "40.0 GiB free" in first[0].message and "pve1/200" in first[0].message
    assert disk.observe(30 * gib, 1000 * gib, 2.0) == []            # still low: said once
    assert disk.observe(100 * gib, 1000 * gib, 3.0) == []           # recovered
    again = disk.observe(gib, 10 * gib, 4.0)                        # under 2 GiB of a small disk (10 %)
    assert [a.kind for a in again] == [LOW_DISK] and disk.low
    relaxed = DiskHealth("pve1/200", rules=AlertRules(min_free_bytes=0.5 * gib, min_free_fraction=0.01))
    assert relaxed.observe(gib, 10 * gib, 0.0) == [] and not relaxed.low
