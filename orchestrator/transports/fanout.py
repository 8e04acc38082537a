"""Run one operation over many targets: hosts in parallel, the targets of one host in turn over its connection.

Like fabric's ThreadingGroup, every target gets a result and a failing host never stops the others.
"""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from ..errors import EXIT_FAILED, EXIT_OK, DflashError, worst_exit_code
from ..inventory.model import Target

T = TypeVar("T")
MAX_PARALLEL_HOSTS = 32


@dataclass(frozen=True)
class Outcome(Generic[T]):
    target: Target
    value: T | None = None
    error: DflashError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def per_host(targets: Sequence[Target], operation: Callable[[Target], T]) -> list[Outcome[T]]:
    """`operation(target)` for every target, in the order given; errors are collected, not raised."""
    by_host: dict[str, list[Target]] = defaultdict(list)
    for target in targets:
        by_host[target.host.name].append(target)
    if not by_host:
        return []
    results: dict[str, Outcome[T]] = {}
    with ThreadPoolExecutor(max_workers=min(len(by_host), MAX_PARALLEL_HOSTS),
                            thread_name_prefix="host") as pool:
        for outcomes in pool.map(lambda group: [_attempt(t, operation) for t in group], by_host.values()):
            results.update({o.target.name: o for o in outcomes})
    return [results[t.name] for t in targets]


def _attempt(target: Target, operation: Callable[[Target], T]) -> Outcome[T]:
    try:
        return Outcome(target, value=operation(target))
    except DflashError as exc:
        return Outcome(target, error=exc)


def fanout_exit_code(outcomes: Sequence[Outcome[T]], succeeded: Callable[[T], bool] = lambda value: True) -> int:
    """The exit code of a command over these outcomes: each error's own code (3 for an unreachable target), 1
    for a value that `succeeded` refuses; the worst of them wins."""
    return worst_exit_code(o.error.exit_code if o.error is not None
                           else EXIT_OK if succeeded(o.value) else EXIT_FAILED for o in outcomes)
