"""Run one operation over many targets: hosts in parallel, the targets of one host in turn over its connection
(per_host) or in parallel too (per_target).

A target the controller could not serve for want of file descriptors or threads gets an error of its own
(OutOfResources, exit 3; shortage.py) naming it; a thread that cannot be started leaves its hosts to the threads
that did.

Like fabric's ThreadingGroup, every target gets a result and a failing host never stops the others.
"""
from __future__ import annotations

import queue
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from ..errors import EXIT_FAILED, EXIT_OK, DflashError, worst_exit_code
from ..inventory.model import Target
from .shortage import out_of_resources

T = TypeVar("T")
MAX_PARALLEL_HOSTS = 64  # threads; most of a target's time is waiting (set-ups take turns: handshakes.py)


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
    return _fanout(targets, operation, lambda target: target.host.name)


def per_target(targets: Sequence[Target], operation: Callable[[Target], T]) -> list[Outcome[T]]:
    """As per_host, with a host's targets in parallel too: over its one connection, as many channels at once as
    its server allows (sessionslots.py sends the rest over another connection)."""
    return _fanout(targets, operation, lambda target: target.name)


def _fanout(targets: Sequence[Target], operation: Callable[[Target], T],
            group_of: Callable[[Target], str]) -> list[Outcome[T]]:
    by_host: dict[str, list[Target]] = defaultdict(list)
    for target in targets:
        by_host[group_of(target)].append(target)
    if not by_host:
        return []
    results: dict[str, Outcome[T]] = {}
    failures: list[BaseException] = []
    groups: queue.SimpleQueue[list[Target]] = queue.SimpleQueue()
    for group in by_host.values():
        groups.put(group)

    def work() -> None:
        try:
            while True:
                group = groups.get_nowait()
                results.update({t.name: _attempt(t, operation) for t in group})
        except queue.Empty:
            return
        except BaseException as exc:  # noqa: BLE001 - a bug: raised in the caller's thread below
            failures.append(exc)

    spare = min(len(by_host), MAX_PARALLEL_HOSTS) - 1
    started = [thread for thread in (threading.Thread(target=work, name=f"host-{i}") for i in range(spare))
               if _started(thread)]
    work()  # this thread serves too: with no thread to spare (the threads limit), it serves them all
    for thread in started:
        thread.join()
    if failures:
        raise failures[0]
    return [results[t.name] for t in targets]


def _started(thread: threading.Thread) -> bool:
    try:
        thread.start()
    except RuntimeError:  # can't start new thread
        return False
    return True


def _attempt(target: Target, operation: Callable[[Target], T]) -> Outcome[T]:
    try:
        return Outcome(target, value=operation(target))
    except DflashError as exc:
        return Outcome(target, error=exc)
    except (OSError, RuntimeError) as exc:
        error = out_of_resources(target.name, exc)
        if error is None:
            raise
        return Outcome(target, error=error)


def fanout_exit_code(outcomes: Sequence[Outcome[T]], succeeded: Callable[[T], bool] = lambda value: True) -> int:
    """The exit code of a command over these outcomes: each error's own code (3 for an unreachable target), 1
    for a value that `succeeded` refuses; the worst of them wins."""
    return worst_exit_code(o.error.exit_code if o.error is not None
                           else EXIT_OK if succeeded(o.value) else EXIT_FAILED for o in outcomes)
