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
"""
from __future__ import annotations

import hashlib
import json
import os

from .errors import BadInput
from .protocol import BAD_USAGE, ascii_decimal
from .rundir import existing_run

MANIFEST = "manifest.json"
SAVED_FILES = ("config.json", "model.safetensors", "training_state.pt", "trainer_config.json")
EXPORT_PREFIX = "export-"  # {output_dir}/export-step_N/: `python -m trainer export` of that checkpoint
HASH_CHUNK = 1024 * 1024


def pull_plan(runs_dir: str, run_id: str, *, checkpoint: str, export: bool, have: list) -> dict:
    paths = existing_run(runs_dir, run_id)
    output_dir = _output_dir(paths.dir)
    steps = _complete_steps(output_dir) if output_dir else []
    chosen = _choose(steps, checkpoint, run_id, output_dir)
    known = _parse_have(have)
    files = []
    export_dir = None
    if export:
        export_dir = os.path.join(output_dir, EXPORT_PREFIX + os.path.basename(chosen[0]))
        if os.path.isfile(os.path.join(export_dir, "README.md")):
            files += _dir_files(export_dir, "")
    else:
        for step_dir in chosen:
            files += _dir_files(step_dir, os.path.basename(step_dir) + "/")
    run_files = [("config.yaml", os.path.join(paths.dir, "config.yaml")), ("train.log", paths.log),
                 ("metrics.jsonl", os.path.join(output_dir, "metrics.jsonl") if output_dir else "")]
    for name, source in run_files:
        if source and os.path.isfile(source):
            files.append(_growing(source, name, known.get(name)))
    return {"ok": True, "output_dir": output_dir, "checkpoints": [os.path.basename(p) for p in chosen],
            "steps": [os.path.basename(p) for p in steps], "export_dir": export_dir,
            "export_ready": bool(export_dir) and os.path.isfile(os.path.join(export_dir, "README.md")),
            "files": files}


def _output_dir(run_dir: str) -> str | None:
    link = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.islink(link) and not os.path.isfile(link):
        return None
    return os.path.dirname(os.path.realpath(link))


def newest_checkpoint(run_dir: str) -> str | None:
    """The name of the newest complete checkpoint of the bundled trainer's run in `run_dir` (step_N), if any."""
    output_dir = _output_dir(run_dir)
    steps = _complete_steps(output_dir) if output_dir else []
    return os.path.basename(steps[-1]) if steps else None


def _complete_steps(output_dir: str) -> list:
    """step_N/ directories that a save completed, oldest first (temp dirs are never named step_N)."""
    found = []
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    for name in names:
        path = os.path.join(output_dir, name)
        step = ascii_decimal(name[len("step_"):]) if name.startswith("step_") else None
        if step is not None and os.path.isdir(path) and (
                os.path.isfile(os.path.join(path, MANIFEST))
                or all(os.path.isfile(os.path.join(path, f)) for f in SAVED_FILES)):
            found.append((step, path))
    return [path for _, path in sorted(found)]


def _choose(steps: list, checkpoint: str, run_id: str, output_dir: str | None) -> list:
    if not steps:
        where = "in {}".format(output_dir) if output_dir else "(it wrote no metrics.jsonl: not the bundled trainer?)"
        raise BadInput("run {} has no complete checkpoint {}".format(run_id, where), code=BAD_USAGE)
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


def _dir_files(directory: str, prefix: str) -> list:
    """Every file of a checkpoint or export directory, with the manifest's size and hash where it has them."""
    manifest = {}
    try:
        with open(os.path.join(directory, MANIFEST)) as handle:
            manifest = json.load(handle).get("files") or {}
    except (OSError, ValueError, AttributeError):
        manifest = {}
    files = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        entry = manifest.get(name) if isinstance(manifest, dict) else None
        listed = isinstance(entry, dict) and entry.get("size") == size and isinstance(entry.get("sha256"), str)
        files.append({"source": path, "dest": prefix + name, "size": size,
                      "sha256": entry["sha256"] if listed else sha256_of(path, size), "growing": False})
    return files


def _growing(source: str, dest: str, have: int | None) -> dict:
    """A file that may still grow: its size now and the hash of those bytes (and of the first `have`)."""
    size = os.path.getsize(source)
    entry = {"source": source, "dest": dest, "size": size, "sha256": sha256_of(source, size), "growing": True}
    if have is not None and 0 < have <= size:
        entry["prefix_size"], entry["prefix_sha256"] = have, sha256_of(source, have)
    return entry


def sha256_of(path: str, size: int) -> str:
    """sha256 of the first `size` bytes of the file, read in chunks."""
    digest = hashlib.sha256()
    left = size
    with open(path, "rb") as handle:
        while left > 0:
            chunk = handle.read(min(HASH_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _parse_have(pairs: list) -> dict:
    known = {}
    for pair in pairs:
        name, _, size = pair.rpartition("=")
        count = ascii_decimal(size)
        if not name or count is None:
            raise BadInput("--have wants NAME=BYTES, not {!r}".format(pair), code=BAD_USAGE)
        known[name] = count
    return known
