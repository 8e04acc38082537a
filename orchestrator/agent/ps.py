"""`ps`: the record of every run (or of the named ones), with dead supervisors turned into `lost`."""
from __future__ import annotations

from .rundir import RunPaths, existing_run, list_run_ids, tail_bytes, unfollowed_run_dirs
from .runstate import load_record, settle_or_note


def list_runs(runs_dir: str, run_ids: list, *, tail: int = 0) -> dict:
    """`tail` > 0 adds `log_tail`: the log's last `tail` bytes, for the controller's step/tok/s parsing.
    `skipped`: what is named like a run but is a symbolic link, never read or written through."""
    if run_ids:
        targets = [existing_run(runs_dir, run_id) for run_id in run_ids]
    else:
        targets = [RunPaths(runs_dir, run_id) for run_id in list_run_ids(runs_dir)]
    records = []
    for paths in targets:
        note = settle_or_note(paths)
        record = load_record(paths)
        if note:
            record["error"] = record.get("error") or note
        if tail > 0:
            record["log_tail"] = tail_bytes(paths.log, tail)
        records.append(record)
    return {"ok": True, "runs": records, "skipped": [] if run_ids else unfollowed_run_dirs(runs_dir)}
