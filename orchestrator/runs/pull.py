"""`dflashctl pull`: what a run made, brought to this machine (its checkpoint or the serving-only export, its
config, metrics.jsonl and log).

The agent lists the files with their sizes and sha256 (the trainer's manifest.json where a checkpoint has one);
fetch.py decides per file what this machine already holds and streams the rest through the target's transport
(SSH, then `pct exec` for a container). An export is made on the target first when it is not there yet
(`python -m trainer export` of the chosen checkpoint into `{output_dir}/export-step_N/`, with the trainer's
parity check against the target the run trained on), so only the serving files travel.

What the agent would not follow (a symbolic link in a checkpoint) is not fetched, and the pull says so; the
progress counts only the bytes that travel, so a file already here never shows a rate.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_records.plans import PullPlan
from dflash_records.protocol import ascii_decimal
from dflash_records.run import RunRecord

from ..errors import OperationFailed, TargetNotFound, UsageError, shorten
from ..inventory.model import Target
from ..transports.timeouts import EXPORT_TIMEOUT_S, PULL_STALL_S
from .addressing import Match
from .client import RunClient
from .fetch import RemoteFile, Step, fetch, plan_steps, shown
from .spec import runs_dir

CHECKPOINT_CHOICES = "latest, all or step_N (e.g. step_1000)"


@dataclass(frozen=True)
class PullRequest:
    checkpoint: str = "latest"
    export: bool = False
    to: Path | None = None
    force: bool = False
    stall: float = PULL_STALL_S


@dataclass
class PullResult:
    run_id: str
    target: str
    to: str
    checkpoints: list[str]
    export: bool
    files: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # symbolic links on the target: not followed, not fetched
    transferred: int = 0
    transfer_s: float = 0.0   # the time the streams took, without start-up, listing and the checks of what is here

    def as_dict(self) -> dict:
        return {"run_id": self.run_id, "target": self.target, "to": self.to, "checkpoints": self.checkpoints,
                "export": self.export, "files": self.files, "skipped": self.skipped,
                "bytes_transferred": self.transferred,
                "transfer_s": round(self.transfer_s, 3)}


class Progress:
    """What a pull reports as it goes (the CLI draws it on stderr): `start` with the bytes and files that will
    travel, `file` for each of those, `note` and `warning` for what it says besides (an export under way; a
    link left out)."""

    def note(self, text: str) -> None: ...

    def warning(self, text: str) -> None: ...

    def start(self, total: int, files: int) -> None: ...

    def file(self, step: Step) -> None: ...

    def advance(self, count: int) -> None: ...

    def done(self) -> None: ...


def check_checkpoint(value: str) -> str:
    if value in ("latest", "all") or (value.startswith("step_") and ascii_decimal(value[5:]) is not None):
        return value
    raise UsageError(f"--checkpoint {shorten(value, 60)!r}: give {CHECKPOINT_CHOICES}")


def node_zero(match: Match) -> tuple[Target, RunRecord]:
    """The run to pull: the run itself, or rank 0's node of a job (rank 0 writes the checkpoints)."""
    if match.kind == "run":
        return match.runs[0]
    for target, run in match.runs:
        if (run.node_rank or 0) == 0:
            return target, run
    raise TargetNotFound(f"job {match.id} has no node 0 to pull from")


def default_destination(run: RunRecord) -> Path:
    return Path.cwd() / (run.name or run.run_id)


def pull(client: RunClient, target: Target, run: RunRecord, request: PullRequest, progress: Progress) -> PullResult:
    if request.export and request.checkpoint == "all":
        raise UsageError("--export makes one serving copy: give --checkpoint latest or step_N, not all")
    root = (request.to or default_destination(run)).resolve()
    if root.exists() and not root.is_dir():
        raise UsageError(f"--to {shown(root)}: not a directory")
    run_id = run.run_id
    plan = _plan(client, target, run_id, request, root)
    if request.export and not plan.export_ready:
        _export(client, target, plan, progress)
        plan = _plan(client, target, run_id, request, root)
    files = [RemoteFile.from_plan(entry) for entry in plan.files]
    steps = plan_steps(root, files, force=request.force)
    result = PullResult(run_id=run_id, target=target.name, to=str(root), checkpoints=list(plan.checkpoints),
                        export=request.export, skipped=[entry.to_dict() for entry in plan.skipped])
    for entry in plan.skipped:  # the agent's word on each link it did not follow
        progress.warning(f"{target.name}: {entry.path} skipped: {entry.reason} (it points to {entry.points_to})")
    _make_destination(root)
    moving = [step for step in steps if step.action != "skip"]
    progress.start(sum(step.file.size - step.offset for step in moving), len(moving))
    transport = client.conns.for_target(target)
    try:
        for step in steps:
            sent = 0
            if step.action != "skip":
                progress.file(step)
                began = time.perf_counter()
                sent = fetch(transport, step, stall=request.stall, on_bytes=progress.advance)
                result.transfer_s += time.perf_counter() - began if sent else 0.0
            result.transferred += sent
            result.files.append({"path": step.file.dest, "size": step.file.size, "sha256": step.file.sha256,
                                 "action": step.action, "resumed_from": step.offset or None})
    finally:
        progress.done()
    return result


def _make_destination(root: Path) -> None:
    """--to DIR made (with its parents) before a byte travels: a path that cannot be a directory is the user's
    to fix, said in one line."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" ({shown(exc.filename)})" if exc.filename and str(exc.filename) != str(root) else ""
        raise UsageError(f"--to {shown(root)}: cannot make this directory: {exc.strerror or exc}{where}") from exc


def _plan(client: RunClient, target: Target, run_id: str, request: PullRequest, root: Path) -> PullPlan:
    args = ["--runs-dir", runs_dir(target), "--run-id", run_id, "--checkpoint", request.checkpoint]
    if request.export:
        args.append("--export")
    for name in ("train.log", "metrics.jsonl", "config.yaml"):
        local = root / name
        if local.is_file():  # a copy from an earlier pull: is it the start of the remote one?
            args += ["--have", f"{name}={local.stat().st_size}"]
    return client.pull_plan(target, args)


def _export(client: RunClient, target: Target, plan: PullPlan, progress: Progress) -> None:
    """Make `{output_dir}/export-step_N/` on the target with the bundled trainer's `export` command."""
    step = plan.checkpoints[0]
    source = f"{plan.output_dir}/{step}"
    progress.note(f"{target.name}: exporting {step} for serving (`python -m trainer export` into "
                  f"{plan.export_dir}, with its parity check against the target model; this takes a while)...")
    began = time.monotonic()
    pkg_dir = client.deploy(target, with_trainer=True).pkg_dir
    argv = ["env", f"PYTHONPATH={pkg_dir}", target.python, "-m", "trainer", "export", source, plan.export_dir]
    result = client.conns.for_target(target).run(argv, timeout=EXPORT_TIMEOUT_S)
    if not result.ok:
        lines = [line for line in (result.err + result.out).strip().splitlines() if line.strip()]
        raise OperationFailed(f"{target.name}: exporting {step} failed: " + shown("; ".join(lines[-3:]) or
                                                                                 result.describe()))
    progress.note(f"{target.name}: exported {step} in {time.monotonic() - began:.1f} s; fetching it")


__all__ = ["PullRequest", "PullResult", "Progress", "pull", "node_zero", "check_checkpoint", "CHECKPOINT_CHOICES"]
