"""Where `launch --anywhere` puts a run: a pure decision from each target's queue answer and the run's GPU count.

The rules, in order:
- a target that could not be asked (or whose GPUs could not be read) is skipped and named;
- a target with fewer GPUs in all than the run needs never takes it;
- a run goes where it can start now: enough GPUs free and nobody queued ahead (a queue is first in, first out,
  so free GPUs behind a queued run are not free to a newcomer);
- among those, a partly used container before a wholly free one, and the one with the fewest free GPUs that
  still fit (Slurm's best fit: narrow runs fill the gaps, whole containers stay whole for the wide run that needs
  one, which would otherwise wait behind narrow runs forever);
- where none can start it now, the shortest queue (then the most GPUs free now: the nearest to starting);
- any tie goes to the target first in the inventory's order.
Same answers in the same order give the same decision; nothing here does IO or reads the clock.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence, Union

from dflash_records.queueinfo import QueueAnswer, QueuedRun

from ..errors import shorten

Asked = Union[QueueAnswer, str]   # the target's answer, or why it could not be asked ("unreachable: ...")
NAMES_SHOWN = 3   # names a reason lists in one group before "and N more"
ERROR_SHOWN = 100  # characters of an unreachable target's error a reason repeats


@dataclass(frozen=True)
class Skipped:
    """A target left out of the decision, and why; `unreachable`: it could not be asked (it may have had room)."""

    target: str
    why: str
    unreachable: bool


@dataclass(frozen=True)
class Placement:
    """The decision: the target (None: no target can take the run), whether the run starts there now or waits
    behind `waiting` queued runs, the reason in one line, and the targets left out."""

    target: str | None
    reason: str
    starts_now: bool = False
    waiting: int = 0
    skipped: tuple[Skipped, ...] = ()

    def to_dict(self) -> dict:
        return {"target": self.target, "reason": self.reason}


@dataclass(frozen=True)
class _Seat:
    """A target that could hold the run: its place in the inventory, its GPUs and its queue's length."""

    name: str
    order: int
    total: int
    free: int
    waiting: int

    @property
    def partly_used(self) -> bool:
        return self.free < self.total


def place(answers: Mapping[str, Asked], gpu_count: int) -> Placement:
    """Where a run of `gpu_count` GPUs goes, given each target's answer in the inventory's order."""
    seats, skipped = _seats(answers, gpu_count)
    if not seats:
        return Placement(None, _nowhere(gpu_count, skipped), skipped=skipped)
    ready = [s for s in seats if s.free >= gpu_count and s.waiting == 0]
    if ready:
        best = min(ready, key=_fit)
        reason = _fit_reason(best, [s for s in ready if s is not best], gpu_count)
    else:
        best = min(seats, key=_queue_rank)
        reason = _queue_reason(best, [s for s in seats if s is not best], gpu_count)
    return Placement(best.name, reason + _skipped_text(skipped), starts_now=bool(ready), waiting=best.waiting,
                     skipped=skipped)


def place_each(answers: Mapping[str, Asked], gpu_counts: Sequence[int]) -> list[Placement]:
    """Runs placed one after the other (a sweep's grid), as single launches in this order would be: each run
    placed takes its GPUs (where it starts now: the lowest free ones, as the agent picks them) or a place at the
    end of the queue (where it waits) in the answers the next run is placed by. A run no target can take is
    placed nowhere (target None) and takes nothing."""
    held = dict(answers)
    decisions = []
    for count in gpu_counts:
        decision = place(held, count)
        decisions.append(decision)
        if decision.target is not None:
            held[decision.target] = _taken(held[decision.target], count, starts_now=decision.starts_now)
    return decisions


def _taken(answer: QueueAnswer, count: int, *, starts_now: bool) -> QueueAnswer:
    """The answer once a run of `count` GPUs placed there started (or joined its queue)."""
    if starts_now:
        free = tuple(sorted(answer.gpus_free))
        return replace(answer, gpus_free=free[count:], gpus_ours=tuple(sorted((*answer.gpus_ours, *free[:count]))))
    return replace(answer, queued=(*answer.queued, QueuedRun(position=len(answer.queued) + 1, gpu_count=count)))


def _fit(seat: _Seat) -> tuple:
    return (not seat.partly_used, seat.free, seat.order)


def _queue_rank(seat: _Seat) -> tuple:
    return (seat.waiting, -seat.free, seat.order)


def _seats(answers: Mapping[str, Asked], gpu_count: int) -> tuple[list[_Seat], tuple[Skipped, ...]]:
    seats, skipped = [], []
    for order, (name, answer) in enumerate(answers.items()):
        if isinstance(answer, str):
            skipped.append(Skipped(name, shorten(answer, ERROR_SHOWN), unreachable=True))
        elif not answer.ok:
            why = shorten(answer.error or "the agent could not read it", ERROR_SHOWN)
            skipped.append(Skipped(name, f"queue not read: {why}", unreachable=False))
        elif not _count(answer.gpus_total) and answer.gpu_error:
            skipped.append(Skipped(name, f"GPUs not read: {shorten(answer.gpu_error, ERROR_SHOWN)}", False))
        elif (_count(answer.gpus_total) or 0) < gpu_count:
            skipped.append(Skipped(name, f"has {_gpus(_count(answer.gpus_total) or 0)}", False))
        else:
            total = _count(answer.gpus_total) or 0
            seats.append(_Seat(name, order, total, min(len(answer.gpus_free), total), len(answer.queued)))
    return seats, tuple(skipped)


def _count(value) -> int | None:
    """A GPU count from the wire: a whole number of at least 0, else unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _fit_reason(best: _Seat, others: list[_Seat], gpu_count: int) -> str:
    head = f"{best.name}: {best.free} of {_gpus(best.total)} free"
    if not others:
        return f"{head} (the only target where {_gpus(gpu_count)} {'is' if gpu_count == 1 else 'are'} free now)"
    if best.partly_used:
        why = "packed onto a partly used container"
    else:
        why = f"no partly used container has {_gpus(gpu_count)} free; the smallest whole container that fits"
    groups: dict[tuple, list[str]] = {}
    for seat in sorted(others, key=_fit):
        groups.setdefault(_fit(seat)[:2], []).append(seat.name)
    said = [f"{_names(names)} {'has' if len(names) == 1 else 'have'} {free} free"
            + (" too (later in the inventory)" if (whole, free) == _fit(best)[:2] else "")
            for (whole, free), names in groups.items()]
    return f"{head} ({why}; {'; '.join(said)})"


def _queue_reason(best: _Seat, others: list[_Seat], gpu_count: int) -> str:
    if any(s.free >= gpu_count for s in (best, *others)):
        why = f"no target can start a run of {_gpus(gpu_count)} now (runs are queued ahead where they are free)"
    else:
        why = f"no target has {_gpus(gpu_count)} free"
    head = f"{best.name}: {why}; its queue is shortest ({best.waiting} waiting"
    head += f", {best.free} free now)" if best.free else ")"
    if not others:
        return head
    runners = sorted(others, key=_queue_rank)[:NAMES_SHOWN]
    said = ", ".join(f"{s.name} ({s.waiting} waiting, {s.free} free)" for s in runners)
    more = len(others) - len(runners)
    return f"{head}; next: {said}" + (f" and {more} more" if more else "")


def _nowhere(gpu_count: int, skipped: tuple[Skipped, ...]) -> str:
    if not skipped:
        return "no target to place the run on"
    return f"no target can take a run of {_gpus(gpu_count)}: " + ", ".join(f"{s.target} ({s.why})" for s in skipped)


def _skipped_text(skipped: tuple[Skipped, ...]) -> str:
    if not skipped:
        return ""
    shown = [f"{s.target} ({s.why})" for s in skipped[:NAMES_SHOWN]]
    more = len(skipped) - len(shown)
    return "; skipped: " + ", ".join(shown) + (f" and {more} more" if more else "")


def _names(names: list[str]) -> str:
    shown = names[:NAMES_SHOWN]
    more = len(names) - len(shown)
    if more:
        return f"{', '.join(shown)} and {more} more"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'}"


__all__ = ["Asked", "Placement", "Skipped", "place", "place_each"]
