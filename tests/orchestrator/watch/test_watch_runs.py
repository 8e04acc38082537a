"""RunTracker: resume from byte offsets without loss or duplicates, resets, alerts kept quiet for old runs."""
from __future__ import annotations

import dataclasses

from dflash_records.run import RunRecord
from dflash_records.step import StepRecord
from orchestrator.watch.trackers import GpuTracker, RunTracker

STEP = ("[{i}s] step={i} loss=2.5 acc=0.1 streak=0.5 lr=1e-4 noise=0.0 | tgt=1.0b/s dft=1.0b/s (11.7Ktok/s) | "
        "q_pre=[5] q_hs=[2] | epoch~0.01 ETA=1h\n")


def tracker(state: str = "running") -> RunTracker:
    return RunTracker("pve1/200", RunRecord(run_id="r", state=state, gpus=[0]), history=100, tail=10)


def test_overlapping_resends_are_dropped_and_split_lines_join() -> None:
    log = "".join(STEP.format(i=i) for i in range(1, 21)).encode()
    run = tracker()
    run.feed(0, 1, log[:500], now=0.0)
    run.feed(250, 1, log[250:1000], now=1.0)  # overlaps what came: only bytes from 500 on count
    run.feed(1000, 1, log[1000:], now=2.0)
    run.feed(0, 1, log[:300], now=3.0)  # a full resend changes nothing
    assert [p.step for p in run.history] == list(range(1, 21))
    assert run.offset == len(log) and run.view().last_step == 20 and len(run.view().log_tail) == 10


def test_reset_restarts_the_parser_and_exceptions_alert() -> None:
    run = tracker()
    run.feed(0, 1, b"half a li", now=0.0)
    alerts = run.reset("truncated", now=0.5)
    alerts += run.feed(0, 2, b"Traceback (most recent call last):\n  File \"x\", line 1\nValueError: bad\n",
                       now=1.0)
    alerts += run.settle(now=2.0)
    assert [a.kind for a in alerts] == ["log_reset", "exception"]
    assert run.view().exceptions == 1 and "truncated" in run.view().log_tail[0]
    assert run.view().log_tail[1].startswith("Traceback")


def test_runs_ended_before_watching_raise_no_alerts_but_new_ends_do() -> None:
    old = tracker("failed")
    assert old.update_record(RunRecord(run_id="r", state="failed", exit_code=1), now=0.0) == []
    assert old.feed(0, 1, b"RuntimeError: boom\n", now=0.0) == []
    assert old.view().exceptions == 1
    live = tracker()
    alerts = live.update_record(RunRecord(run_id="r", state="killed", signal=15), now=0.0)
    assert [(a.kind, a.severity) for a in alerts] == [("ended", "warning")]
    assert live.view().state == "killed"


def test_gpu_tracker_keeps_bounded_history() -> None:
    gpus = GpuTracker("pve2/300", history=3)
    for util in (10, 20, 30, 40):
        samples = gpus.sample(f"0, GPU-x, NVIDIA H200, 1000, 143771, {util}\n1, GPU-y, NVIDIA H200, 0, 143771, 0",
                              now=float(util))
    assert [s.utilization_pct for s in samples] == [40.0, 0.0]
    view = gpus.views()[0]
    assert (view.row.index, view.utilization_history, view.row.memory_total_mib) == (0, (20.0, 30.0, 40.0), 143771.0)


def test_compiling_is_a_phase_until_the_first_step_and_held_idle_gpus_are_not_an_alert() -> None:
    from trainer import logformat

    run = tracker()
    stage = logformat.format_startup_line(50.0, "compiling 2/2 (flex_attention, sliding_attention layers)")
    run.feed(0, 1, ("  Target 0 on cuda:0...\n" + stage + "\n").encode(), now=0.0)
    assert run.view().phase == "compiling 2/2"
    held_idle = [GpuTracker("pve1/200", history=3).sample("0, GPU-x, NVIDIA H200, 35011, 143771, 0", now=0.0)[0]]
    for now in range(0, 600, 30):  # minutes of compiling: memory held at 0 %, which is not a stuck run
        assert run.observe_gpus(held_idle, now=float(now)) == []
    log = STEP.format(i=1).encode()
    run.feed(run.offset, 1, log, now=600.0)
    assert run.view().phase == "training" and run.view().last_step == 1


def test_an_ended_runs_phase_says_it_ended() -> None:
    for state in ("failed", "killed", "lost", "succeeded"):
        run = tracker()
        run.feed(0, 1, STEP.format(i=1).encode(), now=0.0)
        assert run.view().phase == "training"
        run.update_record(RunRecord(run_id="r", state=state), now=1.0)
        assert run.view().phase == "ended" and run.view().last_step == 1
    finished = tracker()
    finished.feed(0, 1, (STEP.format(i=1) + "Finished: 1 steps in 9.0s; saved\n").encode(), now=0.0)
    finished.update_record(RunRecord(run_id="r", state="succeeded", exit_code=0), now=1.0)
    assert finished.view().phase == "finished"


def test_the_view_carries_the_grace_the_run_recorded() -> None:
    assert RunTracker("local", RunRecord(run_id="r", state="running", grace_s=5.0), history=1, tail=1).view().grace_s \
        == 5.0
    assert tracker().view().grace_s is None
    for bad in ("5", -1, True, float("nan")):
        record = {"run_id": "r", "state": "running", "grace_s": bad}
        assert RunTracker("local", RunRecord.from_dict(record), history=1, tail=1).view().grace_s is None


def test_a_generate_progress_line_reads_like_a_step_line() -> None:
    from trainer import logformat

    run = tracker()
    lines = [logformat.format_generate_line(seconds, answered=answered, total=100000, failed=3,
                                            tok_per_s=1900.0, prompts_per_s=3.33, eta_s=eta)
             for seconds, answered, eta in ((300.0, 1000, 32700.0), (360.0, 1200, 32760.0))]
    run.feed(0, 1, ("Generating with model 'q' of http://127.0.0.1:8000/v1 (64 at a time)\n"
                    + "\n".join(lines) + "\n").encode(), now=0.0)
    view = run.view()
    assert (view.phase, view.last_step, view.tok_per_s, view.eta_s) == ("generating", 1200, 1900.0, 9.1 * 3600)
    assert view.loss is None and [p.step for p in run.history] == [1000, 1200]


def test_tau_figures_reach_the_view_and_the_history() -> None:
    def line(step: int, **taus: float) -> str:
        return StepRecord(
            elapsed_s=60.0 * step, step=step, loss=3.0, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
            tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=1000.0, q_pre=[1], q_hs=[], epoch=0.0, eta_s=60.0,
            **taus).to_line() + "\n"

    run = tracker()
    log = line(10, tau_replay=2.1) + line(20, tau_replay=2.25, tau_heldout=1.8, tau_eval=1.75) + line(30)
    run.feed(0, 1, log.encode(), now=0.0)
    view = run.view()
    # a later line without τ keeps the last figures: held-out τ is measured only every eval_every steps
    assert (view.tau_replay, view.tau_heldout, view.tau_eval) == (2.25, 1.8, 1.75) and view.last_step == 30
    assert view.tau == 1.75  # the measured τ first, then the held-out replay, then the training batches'
    assert dataclasses.replace(view, tau_eval=None).tau == 1.8
    assert dataclasses.replace(view, tau_eval=None, tau_heldout=None).tau == 2.25
    assert [(p.step, p.tau_replay, p.tau_heldout) for p in view.history] == [(10, 2.1, None), (20, 2.25, 1.8),
                                                                            (30, None, None)]
    assert view.history[1].tau_eval == 1.75
    assert tracker().view().tau is None


def test_tree_tau_per_budget_reaches_the_view_and_the_history() -> None:
    def line(step: int, **taus) -> str:
        return StepRecord(
            elapsed_s=60.0 * step, step=step, loss=3.0, acc=0.4, streak=2.0, lr=1e-4, noise=0.0,
            tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=1000.0, q_pre=[1], q_hs=[], epoch=0.0, eta_s=60.0,
            **taus).to_line() + "\n"

    run = tracker()
    trees = {64: 3.02, 8: 2.41, 32: 2.93}
    run.feed(0, 1, (line(10) + line(20, tau_heldout=1.8, tau_tree_heldout=trees) + line(30)).encode(), now=0.0)
    view = run.view()
    # kept from the evaluation's line, as tau_heldout is, smallest budget first
    assert view.tau_tree_heldout == ((8, 2.41), (32, 2.93), (64, 3.02)) and view.tau_heldout == 1.8
    assert [p.tau_tree_heldout for p in view.history] == [(), ((8, 2.41), (32, 2.93), (64, 3.02)), ()]


def test_a_steps_metrics_record_gives_its_exact_figures_whichever_comes_first() -> None:
    def metrics(step: int) -> StepRecord:
        return StepRecord(elapsed_s=10.0 * step, step=step, loss=2.71828, acc=0.4, streak=2.0, lr=1e-4,
                          noise=0.0, tgt_batches_per_s=1.0, dft_batches_per_s=1.0, tok_per_s=350.0, q_pre=[],
                          q_hs=[], epoch=0.0)

    def record(step: int) -> bytes:
        return (metrics(step).to_json() + "\n").encode()

    run = tracker()
    line = (metrics(1).to_line() + "\n").encode()
    run.feed(0, 1, line, now=0.0)
    assert run.view().tok_per_s == 300.0  # what `(0.3Ktok/s)` reads as
    run.feed_metrics(0, record(1))  # the record after its line
    assert (run.view().tok_per_s, run.view().loss, run.history[-1].tok_per_s) == (350.0, 2.71828, 350.0)
    run.feed_metrics(0, record(1) + record(2))  # a resend of the first record is dropped; the second waits
    run.feed(len(line), 1, (metrics(2).to_line() + "\n").encode(), now=1.0)
    assert [(p.step, p.tok_per_s) for p in run.history] == [(1, 350.0), (2, 350.0)]
    assert run.metrics_offset == len(record(1) + record(2))
