"""When a run that ended by itself starts again: the restart policy, the backoff, the crash-loop guard.

`never` (the default) or `on-failure[:N]`: after a failed or hung attempt the supervisor starts the workload
again, at most N times (DEFAULT_RESTARTS without N), waiting BACKOFF_BASE_S (`--restart-backoff`, at most
BACKOFF_MAX_S), then twice that, never more than BACKOFF_MAX_S. A kill is never a failure. Pure functions of the
run's records; the supervisor does the IO.

The one home of the policy: the agent's supervisor follows it, the controller checks `--restart` with the same
parse and shows the same reasons, and a multi-node job's workers (torchrun restarts them, with no supervisor
involved) wait the same backoff themselves (worker_backoff: the trainer imports nothing of the controller).
"""
from __future__ import annotations

from .digits import ascii_decimal

NEVER, ON_FAILURE = "never", "on-failure"
DEFAULT_RESTARTS = 3
MAX_RESTARTS = 1000
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
# the same exception line this many attempts in a row, none of them past the best step before them: a crash loop
CRASH_LOOP_ATTEMPTS = 3

# why an attempt ended (state.json's attempts[].reason; a kill's is the run state `killed`) and why a run ended
# without another (state.json's reason)
EXITED, FAILED_EXIT, HUNG, CRASH_LOOP = "exited", "failed", "hung", "crash loop"
BACKOFF_KILLED = "killed during the backoff"  # a kill that came between two attempts, with no workload to end


def parse_policy(text: str) -> dict:
    """`never` | `on-failure` | `on-failure:N` -> {"policy", "max_restarts"}; ValueError says what is wrong."""
    name, sep, count = str(text).strip().partition(":")
    if name == NEVER and not sep:
        return {"policy": NEVER, "max_restarts": 0}
    if name != ON_FAILURE:
        raise ValueError("unknown restart policy {!r}: use never, on-failure or on-failure:N".format(text))
    if not sep:
        return {"policy": ON_FAILURE, "max_restarts": DEFAULT_RESTARTS}
    value = ascii_decimal(count)
    if value is None or value > MAX_RESTARTS:
        raise ValueError("bad restart count in {!r}: N is a whole number from 0 to {}".format(text, MAX_RESTARTS))
    return {"policy": ON_FAILURE, "max_restarts": value}


def policy_text(policy: dict) -> str:
    if policy.get("policy") != ON_FAILURE:
        return NEVER
    return "{}:{}".format(ON_FAILURE, policy.get("max_restarts", DEFAULT_RESTARTS))


def backoff(restart_number: int, *, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_MAX_S) -> float:
    """Seconds to wait before restart number `restart_number` (1 = the first restart): base, 2*base, ... never
    more than cap, whatever the base (a record's may be anything)."""
    doubled = base * 2.0 ** min(max(restart_number - 1, 0), 1000)  # 2.0**1024 overflows; any base is capped first
    return min(doubled, cap) if doubled >= 0 else 0.0


# what a multi-node job's workers read: the base the controller gives them, the restart torchrun numbers
BACKOFF_ENV = "DFLASH_RESTART_BACKOFF_S"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


def worker_backoff(restart_count: str, base: str) -> float:
    """Seconds a job's worker waits before joining again after torchrun restarted the workers (the texts of
    RESTART_COUNT_ENV and BACKOFF_ENV): none on the first start or without a base (a job with no restart policy),
    else `backoff`, so that every worker of every node waits the same and they still meet; ValueError when either
    is not a number."""
    count, seconds = int(restart_count or 0), float(base or 0)
    if count < 1 or not seconds > 0:
        return 0.0
    return backoff(count, base=seconds)


def check_backoff(seconds: float) -> float:
    """A `--restart-backoff` as given; ValueError unless it lies from 0 to BACKOFF_MAX_S (nan, inf, -1, 1e308)."""
    if not 0 <= seconds <= BACKOFF_MAX_S:
        raise ValueError("expected a number of seconds from 0 to {:g}, got {:g}".format(BACKOFF_MAX_S, seconds))
    return seconds


def job_relaunches_left(worker_restarts, job_relaunches) -> int:
    """How often a multi-node job may still be relaunched as a whole: each relaunch spends one of its restart
    policy's restarts (the torchrun `--max-restarts` of each incarnation stays as launched)."""
    return int(worker_restarts or 0) - int(job_relaunches or 0)


def max_attempts(policy: dict) -> int:
    return 1 + (int(policy.get("max_restarts") or 0) if policy.get("policy") == ON_FAILURE else 0)


def crash_loop(attempts: list, *, count: int = CRASH_LOOP_ATTEMPTS) -> str | None:
    """The exception line the last `count` attempts all ended with, none of them past the best step of the
    attempts before them; None while that is not so."""
    if count < 1 or len(attempts) < count:
        return None
    recent = attempts[-count:]
    line = recent[0].get("exception")
    if not line or any(a.get("exception") != line or a.get("reason") == HUNG for a in recent):
        return None
    before = [a.get("last_step") for a in attempts[:-count] if a.get("last_step") is not None]
    best = max(before) if before else None
    for attempt in recent:
        step = attempt.get("last_step")
        if step is not None and (best is None or step > best):
            return None  # it got further than ever before: not the same loop
    return line


def should_restart(policy: dict, attempts: list) -> bool:
    """After the last attempt failed or hung: may another start?"""
    return policy.get("policy") == ON_FAILURE and len(attempts) < max_attempts(policy)


def attempt_end(attempt: dict) -> str:
    """How one attempt ended, for the log and the alerts: `hung`, `failed with exit code 3 (RuntimeError: x)`."""
    if attempt.get("reason") == HUNG:
        text = "hung"
    elif attempt.get("signal"):
        text = "ended by signal {}".format(attempt["signal"]) + (
            " ({})".format(attempt["signal_name"]) if attempt.get("signal_name") else "")
    else:
        text = "failed with exit code {}".format(attempt.get("exit_code"))
    return text + (" ({})".format(attempt["exception"]) if attempt.get("exception") else "")


def restarts_unspent(worker_restarts, attempts) -> bool:
    """Whether a job node ended with torchrun's worker restarts left: its torchrun itself died, or gave up on a
    peer that did (a SIGKILL, an OOM kill, a rendezvous that timed out), rather than its workers failing every
    restart. Its attempts are the first start and one per restart of its workers."""
    return max(len(attempts or []) - 1, 0) < int(worker_restarts or 0)
