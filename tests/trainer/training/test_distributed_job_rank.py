"""The trainer's process group in a multi-node job: its rank follows the job's node order, and a collective
timeout that is configurable, so a dead peer fails the job instead of hanging it."""
from __future__ import annotations

import datetime

import pytest

from trainer.errors import TrainerError
from trainer.training.distributed import collective_timeout, job_rank


def test_rank_follows_the_node_offset_when_given(monkeypatch) -> None:
    monkeypatch.delenv("DFLASH_RANK_OFFSET", raising=False)
    assert job_rank(3, 1, 4) == 3  # torchrun's own rank without a job
    monkeypatch.setenv("DFLASH_RANK_OFFSET", "2")
    assert job_rank(0, 1, 4) == 3 and job_rank(3, 0, 4) == 2
    for bad in ("4", "x", "-3"):
        monkeypatch.setenv("DFLASH_RANK_OFFSET", bad)
        with pytest.raises(TrainerError):
            job_rank(0, 0, 4)


def test_collective_timeout_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("DFLASH_DIST_TIMEOUT_S", raising=False)
    assert collective_timeout() == datetime.timedelta(seconds=600)
    monkeypatch.setenv("DFLASH_DIST_TIMEOUT_S", "12.5")
    assert collective_timeout() == datetime.timedelta(seconds=12.5)
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv("DFLASH_DIST_TIMEOUT_S", bad)
        with pytest.raises(TrainerError):
            collective_timeout()


def test_a_restarted_worker_waits_the_jobs_backoff_doubling_up_to_a_cap(monkeypatch) -> None:
    from trainer.training.distributed import restart_backoff_s

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("DFLASH_RESTART_BACKOFF_S", "10")
    assert restart_backoff_s() == 0   # the first start waits for nothing
    for count, expected in (("0", 0), ("1", 10), ("2", 20), ("3", 40), ("9", 300)):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
        assert restart_backoff_s() == expected
    monkeypatch.delenv("DFLASH_RESTART_BACKOFF_S")
    assert restart_backoff_s() == 0   # a job without a restart policy gets no backoff
    monkeypatch.setenv("DFLASH_RESTART_BACKOFF_S", "soon")
    with pytest.raises(TrainerError):
        restart_backoff_s()
