"""The hang watchdog's bound (hangwatch.py); the restart policy's own rules are tested in tests/dflash_records/."""
from __future__ import annotations

from dflash_agent.hangwatch import HANG_FLOOR_S, HANG_MULTIPLE, AttemptLog


def test_the_hang_bound_waits_for_steps_then_scales_with_the_interval(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"Loading 1 target models...\n")
    watch = AttemptLog(str(log), 0)
    watch.poll(0.0)
    assert watch.bound(None) is None and watch.hung(10_000.0, None) is None  # no step yet: never hung
    with open(log, "ab") as handle:
        handle.write(b"\x1b[32m[1m] step=1 loss=2.0\x1b[0m\n")
    watch.poll(100.0)
    for n, now in ((2, 200.0), (3, 300.0)):
        with open(log, "ab") as handle:
            handle.write("[{}m] step={} loss=2.0\n".format(n, n).encode())
        watch.poll(now)
    assert watch.last_step == 3 and watch.median_interval() == 100.0
    assert watch.bound(None) == max(HANG_FLOOR_S, HANG_MULTIPLE * 100.0)
    assert watch.hung(300.0 + watch.bound(None) - 1, None) is None
    assert watch.hung(300.0 + watch.bound(None) + 1, None) is not None
    assert watch.bound(5.0) == 5.0 and watch.bound(0) is None  # set by the run; 0 turns it off
    with open(log, "ab") as handle:
        handle.write(b"[rank1]: torch.distributed.DistBackendError: NCCL error\npartial")
    watch.poll(301.0)
    assert watch.exception == "torch.distributed.DistBackendError: NCCL error"


def test_a_step_number_longer_than_any_counter_is_no_step_and_raises_nothing():
    from dflash_records.terminaltext import step_number

    assert step_number("[3s] step=12 loss=1.0") == 12
    assert step_number("[3s] step=" + "7" * 5000) is None


def test_nothing_is_judged_hung_while_part_of_the_log_is_unread(tmp_path, monkeypatch):
    from dflash_agent import hangwatch

    log = tmp_path / "train.log"
    log.write_bytes(b"[1s] step=1 loss=2.0\n")
    watch = AttemptLog(str(log), 0)
    watch.poll(0.0)
    with open(log, "ab") as handle:
        handle.write(b"x" * 99 + b"\n" * 1 + (b"y" * 99 + b"\n") * 30_000 + b"[9s] step=9 loss=2.0\n")
    monkeypatch.setattr(hangwatch, "READ_CHUNK", 64 * 1024)
    monkeypatch.setattr(hangwatch, "READ_BUDGET_S", 0.0)  # one chunk a look: the look ends behind
    watch.poll(100.0)
    assert watch.behind and watch.last_step == 1 and watch.hung(100.0, 5.0) is None
    monkeypatch.setattr(hangwatch, "READ_BUDGET_S", 60.0)
    watch.poll(101.0)  # to the end: the step after the burst is seen
    assert not watch.behind and watch.last_step == 9 and watch.hung(101.0, 5.0) is None
    assert watch.hung(107.0, 5.0) is not None
