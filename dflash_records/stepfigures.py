"""Which record gives a step's figures, in every view (ps, watch, its --json, notifications): the step's line of
metrics.jsonl where one came, exact, and its human log line otherwise, which rounds (`(0.3Ktok/s)` for 350.4
tok/s). The log line still says which step is the latest: the two files are written one after the other and
race, and a workload may write no metrics.jsonl at all."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Optional

from .step import RECORD_FIELDS, StepRecord, read_step_json


def with_exact(line: StepRecord, exact: Optional[StepRecord]) -> StepRecord:
    """The one rule by which every view reads a step's figures (ps, watch, notifications, --json): those of its
    metrics.jsonl record where one came for that step, the step line's otherwise. The line's record (and its
    class, e.g. the controller's StepEvent with its text) is kept; only the figures are replaced."""
    if exact is None or exact.step != line.step:
        return line
    return replace(line, **{name: getattr(exact, name) for name in RECORD_FIELDS
                            if getattr(exact, name) is not None})


def latest_step(line: Optional[StepRecord], exact: Dict[int, StepRecord]) -> Optional[StepRecord]:
    """The latest step a run reports: its last step line (`line`) with the figures of its record in `exact`
    ({step: the record read from metrics.jsonl}); the newest record alone when no step line was read."""
    if line is None:
        return exact[max(exact)] if exact else None
    return with_exact(line, exact.get(line.step))


def exact_records(metrics_tail: Optional[str], cls=StepRecord) -> Dict[int, StepRecord]:
    """{step: its record as `cls`} of the step records in the end of a metrics.jsonl (None: no file came); a torn
    or foreign line is skipped."""
    exact: Dict[int, StepRecord] = {}
    for text in (metrics_tail or "").splitlines():
        record = read_step_json(text, cls)
        if record is not None and record.step is not None:
            exact[record.step] = record
    return exact
