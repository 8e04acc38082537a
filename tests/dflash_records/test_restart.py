"""The restart policy (dflash_records/restart.py): its parse, backoff and cap, the crash-loop guard, and the
backoff a multi-node job's workers wait, which is the supervisor's."""
from __future__ import annotations

import pytest

from dflash_records.restart import (BACKOFF_MAX_S, backoff, crash_loop, parse_policy, restarts_unspent,
                                    should_restart, worker_backoff)


def test_policies_parse_and_bad_ones_say_why():
    assert parse_policy("never") == {"policy": "never", "max_restarts": 0}
    assert parse_policy("on-failure") == {"policy": "on-failure", "max_restarts": 3}
    assert parse_policy("on-failure:0") == {"policy": "on-failure", "max_restarts": 0}
    for bad in ("on-failure:-1", "on-failure:x", "on-failure:", "on-failure:\u00b2", "always", "never:1", ""):
        with pytest.raises(ValueError):
            parse_policy(bad)


def test_backoff_doubles_up_to_its_cap():
    assert [backoff(n, base=10, cap=300) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff(1, base=0.2) == 0.2


def test_should_restart_counts_attempts_against_n():
    policy = parse_policy("on-failure:2")
    assert should_restart(policy, [{}]) and should_restart(policy, [{}, {}]) and not should_restart(policy, [{}] * 3)
    assert not should_restart(parse_policy("never"), [{}])


def failed(line, step=None):
    return {"reason": "failed", "exception": line, "last_step": step}


def test_a_crash_loop_is_the_same_line_three_times_without_progress():
    same = "RuntimeError: NCCL timeout"
    assert crash_loop([failed(same), failed(same)]) is None
    assert crash_loop([failed(same), failed(same), failed(same)]) == same
    assert crash_loop([failed(same), failed("OSError: x"), failed(same)]) is None
    # each attempt got further than any before it: progress, not a loop
    assert crash_loop([failed(same, 100), failed(same, 200), failed(same, 300), failed(same, 400)]) is None
    # stuck at the same step after a good start
    assert crash_loop([failed(same, 500), failed(same, 500), failed(same, 400), failed(same, 450)]) == same
    assert crash_loop([failed(None), failed(None), failed(None)]) is None  # no exception line: no loop judged


@pytest.mark.parametrize("base", [0.5, 10.0, 400.0, 1e308])
def test_a_jobs_workers_wait_the_supervisors_backoff_never_past_the_cap(base: float) -> None:
    # torchrun restarts a job's workers with no supervisor involved: they wait what it would have
    for restart in (*range(1, 10), 5000):
        assert worker_backoff(str(restart), f"{base:g}") == backoff(restart, base=base) <= BACKOFF_MAX_S, restart
    assert worker_backoff("0", f"{base:g}") == worker_backoff("", f"{base:g}") == 0.0   # the first start
    assert worker_backoff("3", "") == worker_backoff("3", "0") == worker_backoff("3", "nan") == 0.0   # no policy
    for count, seconds in (("x", "10"), ("1", "soon")):
        with pytest.raises(ValueError):
            worker_backoff(count, seconds)


def test_a_node_has_restarts_unspent_only_while_its_attempts_are_fewer_than_one_plus_its_restarts():
    # attempts: the first start and one per restart of its workers; a torchrun that died has restarts left
    assert restarts_unspent(3, [{}]) and restarts_unspent(3, [{}, {}, {}])
    assert not restarts_unspent(3, [{}, {}, {}, {}]) and not restarts_unspent(0, [{}])
    assert not restarts_unspent(None, None)
