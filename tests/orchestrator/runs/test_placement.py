"""The placement rules of `launch --anywhere`, on queue answers alone (no lab: the decision is a pure function)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_records.queueinfo import QueueAnswer, QueuedRun
from orchestrator.runs.placement import place


def box(total: int, free: int, waiting: int = 0, *, foreign: int = 0) -> QueueAnswer:
    """A container of `total` GPUs, `free` of them free (the lowest indices busy: ours, then `foreign`'s), with
    `waiting` runs queued."""
    busy = list(range(total - free))
    return QueueAnswer(ok=True, gpus_total=total, gpus_free=tuple(range(total - free, total)),
                       gpus_ours=tuple(busy[foreign:]), gpus_foreign=tuple(busy[:foreign]),
                       queued=tuple(QueuedRun(run_id=f"q{i}", position=i + 1, gpu_count=1) for i in range(waiting)))


def test_a_narrow_run_is_packed_onto_the_partly_used_container_and_the_reason_names_the_others() -> None:
    answers = {"pve1/200": box(2, 2), "pve2/300": box(2, 1), "pve3/400": box(2, 2)}
    decision = place(answers, 1)
    assert decision.target == "pve2/300" and decision.starts_now
    assert decision.reason == ("pve2/300: 1 of 2 GPUs free (packed onto a partly used container; "
                               "pve1/200 and pve3/400 have 2 free)")


def test_a_gpu_held_by_a_foreign_process_makes_a_container_partly_used() -> None:
    decision = place({"a": box(2, 2), "b": box(2, 1, foreign=1)}, 1)
    assert decision.target == "b"


def test_narrow_runs_fill_one_container_before_opening_the_next_so_a_wide_run_still_starts() -> None:
    """Slurm's lesson: six 1-GPU runs on three 8-GPU containers leave two of them whole, and an 8-GPU run placed
    after them starts at once."""
    free = {"pve1/200": 8, "pve2/300": 8, "pve3/400": 8}
    for _ in range(6):
        chosen = place({name: box(8, n) for name, n in free.items()}, 1)
        assert chosen.starts_now
        free[chosen.target] -= 1
    assert sorted(free.values()) == [2, 8, 8]
    wide = place({name: box(8, n) for name, n in free.items()}, 8)
    assert wide.starts_now and free[wide.target] == 8


def test_the_smallest_whole_container_that_fits_is_chosen_when_none_is_partly_used() -> None:
    decision = place({"big": box(8, 8), "small": box(2, 2), "mid": box(4, 4)}, 2)
    assert decision.target == "small"
    assert "no partly used container has 2 GPUs free" in decision.reason
    assert "mid has 4 free; big has 8 free" in decision.reason


def test_free_gpus_behind_a_queued_run_are_not_free_to_a_newcomer() -> None:
    """A queue is first in, first out: a 1-GPU run placed where a 2-GPU run waits would wait behind it."""
    answers = {"a": box(2, 1, waiting=1), "b": box(2, 0, waiting=0)}
    decision = place(answers, 1)
    assert not decision.starts_now and decision.target == "b" and decision.waiting == 0
    assert decision.reason.startswith("b: no target can start a run of 1 GPU now")


def test_with_no_gpus_free_anywhere_the_run_queues_where_the_queue_is_shortest() -> None:
    answers = {"pve1/200": box(2, 0, waiting=3), "pve2/300": box(2, 0, waiting=1), "pve3/400": box(2, 0, waiting=2)}
    decision = place(answers, 2)
    assert decision.target == "pve2/300" and not decision.starts_now and decision.waiting == 1
    assert decision.reason == ("pve2/300: no target has 2 GPUs free; its queue is shortest (1 waiting); next: "
                               "pve3/400 (2 waiting, 0 free), pve1/200 (3 waiting, 0 free)")


def test_equal_queues_go_to_the_nearest_to_starting_then_to_the_inventory_order() -> None:
    assert place({"a": box(4, 0, 1), "b": box(4, 2, 1), "c": box(4, 2, 1)}, 4).target == "b"
    assert place({"c": box(4, 2, 1), "b": box(4, 2, 1)}, 4).target == "c"


def test_a_target_with_fewer_gpus_than_the_run_needs_never_takes_it() -> None:
    answers = {"small": box(1, 1), "busy": box(2, 0, waiting=5)}
    decision = place(answers, 2)
    assert decision.target == "busy"
    assert "skipped: small (has 1 GPU)" in decision.reason
    nowhere = place({"small": box(1, 1)}, 2)
    assert nowhere.target is None and nowhere.reason == "no target can take a run of 2 GPUs: small (has 1 GPU)"
    assert not any(s.unreachable for s in nowhere.skipped)


def test_unreachable_targets_are_skipped_and_named() -> None:
    answers = {"pve1/200": "unreachable: cannot connect to 10.0.0.1:22: Connection refused",
               "pve2/300": QueueAnswer(ok=False, error="runs directory unreadable"),
               "pve3/400": QueueAnswer(ok=True, gpus_total=None, gpu_error="nvidia-smi: command failed"),
               "pve4/500": box(2, 2)}
    decision = place(answers, 1)
    assert decision.target == "pve4/500"
    assert [(s.target, s.unreachable) for s in decision.skipped] == \
        [("pve1/200", True), ("pve2/300", False), ("pve3/400", False)]
    assert decision.reason.endswith("; skipped: pve1/200 (unreachable: cannot connect to 10.0.0.1:22: Connection "
                                    "refused), pve2/300 (queue not read: runs directory unreadable), pve3/400 (GPUs "
                                    "not read: nvidia-smi: command failed)")
    alone = place({"pve1/200": "down"}, 1)
    assert alone.target is None and alone.skipped[0].unreachable


def test_a_gpu_count_that_is_not_a_count_on_the_wire_takes_no_run() -> None:
    for total in ("8", -1, True, None, 2.5):
        answer = QueueAnswer.from_dict({"ok": True, "gpus_total": total, "gpus_free": [0, 1]})
        assert place({"odd": answer}, 1).target is None


# -- properties -----------------------------------------------------------------------------------------------

@st.composite
def fleets(draw):
    """Up to 8 targets in inventory order: containers of 0-8 GPUs with some free and some waiting, or unreachable."""
    count = draw(st.integers(1, 8))
    answers = {}
    for index in range(count):
        if draw(st.integers(0, 5)) == 0:
            answers[f"pve{index}/1"] = "unreachable"
            continue
        total = draw(st.integers(0, 8))
        answers[f"pve{index}/1"] = box(total, draw(st.integers(0, total)), draw(st.integers(0, 3)))
    return answers, draw(st.integers(1, 8))


def _rank(answer: QueueAnswer, need: int, ready: bool) -> tuple:
    free = len(answer.gpus_free)
    if ready:
        return (free == answer.gpus_total, free)
    return (len(answer.queued), -free)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_same_answers_give_the_same_decision_and_only_ties_depend_on_the_order(fleet) -> None:
    answers, need = fleet
    decision = place(answers, need)
    rebuilt = {name: a if isinstance(a, str) else QueueAnswer.from_dict(json.loads(json.dumps(a.to_dict())))
               for name, a in answers.items()}
    assert place(rebuilt, need) == decision
    backwards = place(dict(reversed(list(answers.items()))), need)
    assert (backwards.target is None) == (decision.target is None)
    if decision.target is not None:
        assert backwards.starts_now == decision.starts_now
        assert _rank(answers[backwards.target], need, decision.starts_now) == \
            _rank(answers[decision.target], need, decision.starts_now)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_the_decision_follows_the_rules(fleet) -> None:
    answers, need = fleet
    decision = place(answers, need)
    fits = {n: a for n, a in answers.items() if not isinstance(a, str) and a.gpus_total >= need}
    ready = {n: a for n, a in fits.items() if len(a.gpus_free) >= need and not a.queued}
    assert {s.target for s in decision.skipped} == set(answers) - set(fits)
    assert all(s.target in decision.reason for s in decision.skipped[:3])
    if not fits:
        assert decision.target is None
        return
    assert decision.target in fits and decision.reason.startswith(f"{decision.target}: ")
    assert decision.starts_now == bool(ready)
    pool = ready or fits
    best = min(_rank(a, need, bool(ready)) for a in pool.values())
    assert _rank(answers[decision.target], need, bool(ready)) == best
    first = next(n for n, a in pool.items() if _rank(a, need, bool(ready)) == best)
    assert decision.target == first  # a tie goes to the first in the inventory's order


def test_a_grid_placed_one_after_the_other_packs_and_queues_as_single_launches_would() -> None:
    """A sweep's placement: each run placed takes its GPUs or a queue slot in the answers the next is placed by;
    the same answers give the same grid, and each decision is the one a single launch would get at that point."""
    from orchestrator.runs.placement import place_each

    answers = {"a": box(2, 1), "b": box(2, 2), "c": box(4, 4)}
    decisions = place_each(answers, [1, 1, 2, 1, 2, 1, 1, 1, 1, 1])
    assert [(d.target, d.starts_now, d.waiting) for d in decisions] == [
        ("a", True, 0), ("b", True, 0), ("c", True, 0), ("b", True, 0), ("c", True, 0),
        ("a", False, 0), ("b", False, 0), ("c", False, 0), ("a", False, 1), ("b", False, 1)]
    assert [d.reason for d in decisions] == [d.reason for d in place_each(answers, [1, 1, 2, 1, 2, 1, 1, 1, 1, 1])]
    assert decisions[5].reason.startswith("a: no target has 1 GPU free; its queue is shortest (0 waiting)")
    assert answers["a"] == box(2, 1)  # the answers given are not changed
    held = dict(answers)
    for decision, count in zip(decisions, [1, 1, 2, 1, 2]):  # as single launches, the answers updated by hand
        assert place(held, count).target == decision.target
        free = held[decision.target].gpus_free
        held[decision.target] = QueueAnswer(ok=True, gpus_total=held[decision.target].gpus_total,
                                            gpus_free=free[count:])


def test_a_grid_run_no_target_can_take_is_placed_nowhere_and_takes_nothing() -> None:
    from orchestrator.runs.placement import place_each

    decisions = place_each({"a": box(2, 2), "b": "unreachable: timed out"}, [4, 1])
    assert decisions[0].target is None and "a (has 2 GPUs)" in decisions[0].reason
    assert decisions[1].target == "a" and decisions[1].starts_now
