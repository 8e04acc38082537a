"""The queue's answer on the wire, and a queued run's place in words."""
from __future__ import annotations

import json

from dflash_records.queueinfo import QueueAnswer, QueuedRun, ordinal


def test_places_read_as_english_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"]


def test_a_queue_answer_survives_the_wire_and_keeps_what_a_newer_agent_adds() -> None:
    answer = QueueAnswer(ok=True, gpus_total=2, gpus_free=(1,), gpus_foreign=(0,),
                         queued=(QueuedRun(run_id="a", position=1, gpu_count=2, queued_at="2026-12-07T12:00:00Z"),
                                 QueuedRun(run_id="b", position=2, gpus=(1,), sweep_id="s1")))
    wire = json.loads(json.dumps(answer.to_dict()))
    assert "gpus" not in wire["queued"][0] and wire["queued"][1]["gpus"] == [1]  # only what a run asked for
    assert "error" not in wire and "gpu_error" not in wire
    assert QueueAnswer.from_dict(wire) == answer
    newer = dict(wire, slots=4, queued=[dict(wire["queued"][0], priority=9)])
    again = QueueAnswer.from_dict(newer)
    assert again.extra == {"slots": 4} and again.queued[0].extra == {"priority": 9}
    assert again.to_dict()["queued"][0]["priority"] == 9
