"""What `dflashctl pull` fetches of a run: the files of its checkpoint (or of its serving-only export), its config,
metrics.jsonl and log, each with the size and sha256 the controller verifies the copy against.

A checkpoint's sizes and hashes come from the manifest.json the trainer writes as the last step of a save (a file
the manifest does not list, or lists with another size, is hashed here, in chunks). metrics.jsonl and the log may
still grow: each is offered at its size now, hashed over those bytes, and where the controller already holds a
shorter copy (`have`), the hash of the same number of bytes here tells it whether its copy is the start of this
one (then only the rest is fetched).

The bundled trainer's output_dir is where the run's metrics.jsonl link points (the trainer makes that link in
the run directory). Checkpoint files named here are the trainer's (trainer/training/checkpoints.py); the agent
cannot import the trainer, so a step_N/ counts as complete when it has a manifest or every file a save writes.

A symbolic link is never followed, as a linked run directory is not: a link in a checkpoint (or a linked step_N/,
config, log or metrics.jsonl) would hand over whatever it points to, anywhere on the target. It is left out and
listed in `skipped`, so the controller says so.
"""
from __future__ import annotations

import os
import stat

from dflash_records.digest import MANIFEST_FILE, sha256_of
from dflash_records.plans import PlanFile, PullPlan, SkippedPath
from dflash_records.protocol import BAD_USAGE, ascii_decimal
from dflash_records.terminaltext import for_terminal

from .errors import BadInput
from .rundir import existing_run, read_json
from .runstate import is_live, read_run, read_state

SAVED_FILES = ("config.json", "model.safetensors", "training_state.pt", "trainer_config.json")
EXPORT_PREFIX = "export-"  # {output_dir}/export-step_N/: `python -m trainer export` of that checkpoint
LINK_REASON = "a symbolic link: not followed"


def pull_plan(runs_dir: str, run_id: str, *, checkpoint: str, export: bool, have: list) -> PullPlan:
    paths = existing_run(runs_dir, run_id)
    output_dir = _output_dir(paths.dir)
    skipped = []
    steps = _complete_steps(output_dir, skipped) if output_dir else []
    if not steps:
        raise BadInput(_no_checkpoint(paths, output_dir), code=BAD_USAGE)
    chosen = _choose(steps, checkpoint, run_id)
    known = _parse_have(have)
    files = []
    export_dir = None
    if export:
        export_dir = os.path.join(output_dir, EXPORT_PREFIX + os.path.basename(chosen[0]))
        if os.path.isfile(os.path.join(export_dir, "README.md")):
            files += _dir_files(export_dir, "", skipped)
    else:
        for step_dir in chosen:
            files += _dir_files(step_dir, os.path.basename(step_dir) + "/", skipped)
    run_files = [("config.yaml", os.path.join(paths.dir, "config.yaml")), ("train.log", paths.log),
                 ("metrics.jsonl", os.path.join(output_dir, "metrics.jsonl"))]
    for name, source in run_files:
        kind = _kind(source)
        if kind == "link":
            skipped.append(_skipped(source, name))
        elif kind == "file":
            files.append(_growing(source, name, known.get(name)))
    return PullPlan(ok=True, output_dir=output_dir, checkpoints=tuple(os.path.basename(p) for p in chosen),
                    steps=tuple(os.path.basename(p) for p in steps), export_dir=export_dir,
                    export_ready=bool(export_dir) and os.path.isfile(os.path.join(export_dir, "README.md")),
                    files=tuple(map(PlanFile.from_dict, files)), skipped=tuple(map(SkippedPath.from_dict, skipped)))


def _kind(path: str) -> str | None:
    """"file", "dir" or "link" for what `path` itself is (a link is not followed); None for anything else."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else None


def _skipped(path: str, dest: str) -> dict:
    try:
        points_to = os.readlink(path)
    except OSError:
        points_to = "?"
    return {"path": path, "dest": dest, "points_to": points_to, "reason": LINK_REASON}


def _no_checkpoint(paths, output_dir: str | None) -> str:
    """Why there is nothing to pull: a live run that has not saved yet, or an ended one that never did (the
    output_dir, which the workload chose, as terminal text: the message reaches one)."""
    output_dir = for_terminal(output_dir) if output_dir else None
    if is_live(paths, read_run(paths), read_state(paths)):
        where = " (its output_dir {})".format(output_dir) if output_dir else ""
        return "run {} has no checkpoint yet{}: it is still running; pull once it has saved one".format(
            paths.run_id, where)
    where = "in {}".format(output_dir) if output_dir else "(it wrote no metrics.jsonl: not the bundled trainer?)"
    return "run {} has no complete checkpoint {}".format(paths.run_id, where)


def _output_dir(run_dir: str) -> str | None:
    link = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.islink(link) and not os.path.isfile(link):
        return None
    return os.path.dirname(os.path.realpath(link))


def newest_checkpoint(run_dir: str) -> str | None:
    """The name of the newest complete checkpoint of the bundled trainer's run in `run_dir` (step_N), if any."""
    output_dir = _output_dir(run_dir)
    steps = _complete_steps(output_dir, []) if output_dir else []
    return os.path.basename(steps[-1]) if steps else None


def _complete_steps(output_dir: str, skipped: list) -> list:
    """step_N/ directories that a save completed, oldest first (temp dirs are never named step_N); a linked
    step_N/ is listed in `skipped` instead."""
    found = []
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    for name in names:
        path = os.path.join(output_dir, name)
        step = ascii_decimal(name[len("step_"):]) if name.startswith("step_") else None
        kind = _kind(path) if step is not None else None
        if kind == "link":
            skipped.append(_skipped(path, name + "/"))
        elif kind == "dir" and (_kind(os.path.join(path, MANIFEST_FILE)) == "file"
                                or all(_kind(os.path.join(path, f)) == "file" for f in SAVED_FILES)):
            found.append((step, path))
    return [path for _, path in sorted(found)]


def _choose(steps: list, checkpoint: str, run_id: str) -> list:
    if checkpoint == "latest":
        return steps[-1:]
    if checkpoint == "all":
        return steps
    named = [p for p in steps if os.path.basename(p) == checkpoint]
    if not named:
        have = ", ".join(os.path.basename(p) for p in steps[-10:])
        raise BadInput("run {} has no complete checkpoint {} (it has: {})".format(run_id, checkpoint, have),
                       code=BAD_USAGE)
    return named


def _dir_files(directory: str, prefix: str, skipped: list) -> list:
    """Every file of a checkpoint or export directory, with the manifest's size and hash where it has them
    (`manifest`: true; those the controller reports as the checkpoint changed since its save when they differ).
    Links go to `skipped`; subdirectories are not the trainer's and are left out."""
    manifest = (read_json(os.path.join(directory, MANIFEST_FILE)) or {}).get("files")
    files = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        kind = _kind(path)
        if kind == "link":
            skipped.append(_skipped(path, prefix + name))
        if kind != "file":
            continue
        size = os.path.getsize(path)
        entry = manifest.get(name) if isinstance(manifest, dict) else None
        listed = isinstance(entry, dict) and entry.get("size") == size and isinstance(entry.get("sha256"), str)
        files.append({"source": path, "dest": prefix + name, "size": size, "manifest": listed,
                      "sha256": entry["sha256"] if listed else sha256_of(path, size), "growing": False})
    return files


def _growing(source: str, dest: str, have: int | None) -> dict:
    """A file that may still grow: its size now and the hash of those bytes (and of the first `have`)."""
    size = os.path.getsize(source)
    entry = {"source": source, "dest": dest, "size": size, "sha256": sha256_of(source, size), "growing": True}
    if have is not None and 0 < have <= size:
        entry["prefix_size"], entry["prefix_sha256"] = have, sha256_of(source, have)
    return entry


def _parse_have(pairs: list) -> dict:
    known = {}
    for pair in pairs:
        name, _, size = pair.rpartition("=")
        count = ascii_decimal(size)
        if not name or count is None:
            raise BadInput("--have wants NAME=BYTES, not {!r}".format(pair), code=BAD_USAGE)
        known[name] = count
    return known
