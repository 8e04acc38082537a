"""`ps`: the record of every run (or of the named ones), with dead supervisors turned into `lost`."""
from __future__ import annotations

from dflash_records.answers import PsAnswer, SkippedRunDir
from dflash_records.run import RunRecord

from .queuelaunch import QueuePlaces
from .rundir import RunPaths, existing_run, list_run_ids, tail_bytes, unfollowed_run_dirs
from .runstate import load_record, settle_or_note

# of metrics.jsonl, the last few records (a record is under 1 KiB): the one of the log's last step line is among
# them, unless the trainer writes no record for it
METRICS_TAIL_BYTES = 4096


def list_runs(runs_dir: str, run_ids: list, *, tail: int = 0) -> PsAnswer:
    """`tail` > 0 adds each log's last `tail` bytes and the last records of its metrics.jsonl (`log_tail` and
    `metrics_tail` on the wire): the latest step line and its exact figures (dflash_records/stepfigures.py) for
    the controller. `skipped`: what is named like a run but is a symbolic link, never read or written
    through."""
    if run_ids:
        targets = [existing_run(runs_dir, run_id) for run_id in run_ids]
    else:
        targets = [RunPaths(runs_dir, run_id) for run_id in list_run_ids(runs_dir)]
    records, tails, metrics = [], [], []
    places = QueuePlaces(runs_dir)
    for paths in targets:
        note = settle_or_note(paths)
        record = load_record(paths)
        if note:
            record["error"] = record.get("error") or note
        records.append(RunRecord.from_dict(places.add_to(paths.run_id, record)))
        tails.append(tail_bytes(paths.log, tail) if tail > 0 else None)
        metrics.append(tail_bytes(paths.metrics, min(tail, METRICS_TAIL_BYTES)) if tail > 0 else None)
    skipped = () if run_ids else tuple(map(SkippedRunDir.from_dict, unfollowed_run_dirs(runs_dir)))
    return PsAnswer(ok=True, runs=tuple(records), skipped=skipped, log_tails=tuple(tails),
                    metrics_tails=tuple(metrics))
