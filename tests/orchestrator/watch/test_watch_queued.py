"""Queued runs in the watch and the dashboard: `queued (2nd)` and what it waits for, no live run's alerts while it
waits (it has no process), the `ended` alert with the reason when its start fails, and the GPUs it was given
watched once it starts."""
from __future__ import annotations

from dflash_records.run import RunRecord
from orchestrator.display import STATE_STYLES, UNKNOWN_STATE_STYLE
from orchestrator.watch.trackers import GpuTracker, RunTracker
from tui.runcells import run_cells
from tui.screens.kill_confirm import kill_details, kill_question

STEP = ("[{i}s] step={i} loss=2.5 acc=0.1 streak=0.5 lr=1e-4 noise=0.0 | tgt=1.0b/s dft=1.0b/s (11.7Ktok/s) | "
        "q_pre=[5] q_hs=[2] | epoch~0.01 ETA=1h\n")
QUEUED = {"run_id": "lr3-1", "name": "lr3", "state": "queued", "queue_position": 2, "gpu_count": 2,
          "queued_at": "2026-05-01T12:00:00.000Z"}
HELD_IDLE = "0, GPU-a, NVIDIA H200, 35011, 143771, 0\n1, GPU-b, NVIDIA H200, 35011, 143771, 0"


def queued_tracker(**record) -> RunTracker:
    return RunTracker("pve1/200", RunRecord.from_dict({**QUEUED, **record}), history=100, tail=10)


def test_a_queued_run_reads_queued_2nd_and_what_it_waits_for_in_the_runs_table() -> None:
    view = queued_tracker().view()
    assert (view.state, view.queue_position, view.waits_for) == ("queued", 2, "2 GPUs")
    cells = run_cells(view)
    assert cells["state"].plain == "queued (2nd)" and cells["phase"].plain == "waits for 2 GPUs"
    assert cells["state"].style == STATE_STYLES["queued"] != UNKNOWN_STATE_STYLE
    assert run_cells(queued_tracker(gpu_count=None, gpus=[1], queue_position=1).view())["phase"].plain == \
        "waits for GPU 1"
    assert "leaves the queue and never starts" in kill_question(view, 30.0)
    assert kill_details(view).plain == "queued (2nd), waiting for 2 GPUs"


def test_a_queued_run_raises_no_live_runs_alerts_and_has_no_bottleneck() -> None:
    run = queued_tracker()
    gpus = GpuTracker("pve1/200", history=3)
    alerts = run.update_record(RunRecord.from_dict(dict(QUEUED)), now=0.0)
    for now in range(0, 7200, 60):  # two hours in the queue beside GPUs another run holds at 0 %
        samples = gpus.sample(HELD_IDLE, now=float(now))
        alerts += run.observe_gpus(samples, now=float(now)) + run.settle(now=float(now))
    assert alerts == [] and not run.health.ended
    assert run.diagnosed_view(gpus.views()).bottleneck is None


def test_a_queued_run_whose_start_failed_raises_the_ended_alert_with_why() -> None:
    run = queued_tracker()
    run.update_record(RunRecord.from_dict(dict(QUEUED)), now=0.0)
    why = "its config no longer passes the trainer's check: data path /data/x does not exist"
    failed = RunRecord.from_dict({**QUEUED, "state": "failed", "queue_position": None, "error": why})
    alerts = run.update_record(failed, now=5.0)
    assert [(a.kind, a.severity) for a in alerts] == [("ended", "error")]
    assert alerts[0].message == f"run failed: {why}"
    assert run.view().waits_for is None and run_cells(run.view())["state"].plain == "failed"


def test_a_run_queued_for_any_two_gpus_is_watched_on_those_it_was_given() -> None:
    """Started on GPUs 2 and 3: GPUs 0 and 1, held at 0 % by someone else, are not its idle GPUs."""
    run = queued_tracker()
    started = RunRecord.from_dict({**QUEUED, "state": "running", "queue_position": None, "gpus": [2, 3], "pid": 7})
    run.update_record(started, now=0.0)
    log = "".join(STEP.format(i=i) for i in range(1, 4)).encode()
    run.feed(0, 1, log, now=1.0)
    gpus = GpuTracker("pve1/200", history=3)
    alerts = []
    for now in range(2, 300, 10):
        alerts += run.observe_gpus(gpus.sample(HELD_IDLE, now=float(now)), now=float(now))
    assert [a.kind for a in alerts] == []
    assert run.view().state == "running" and run.view().gpus == (2, 3)
