"""The agent's answers that report on a container rather than a run's life: what `pull` fetches (pull-plan), what
cleanup did and found, and the facts doctor judges (probe). Typed and coded as answers.py's are (wire.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .answers import FAILURE, ProcessInfo
from .wire import WireRecord, decode, each, encode, extra_keys, of


@dataclass(frozen=True)
class PlanFile(WireRecord):
    """A file to fetch: where it is, where it goes under the pull's folder, its size and sha256 now; a growing
    one (train.log, metrics.jsonl) with the hash of the prefix the caller said it holds (--have)."""

    SKIP_NONE = ("prefix_size", "prefix_sha256")

    source: str = ""
    dest: str = ""
    size: int = 0
    sha256: str | None = None
    growing: bool = False
    manifest: bool = False
    prefix_size: int | None = None
    prefix_sha256: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class SkippedPath(WireRecord):
    """A path a pull plan did not follow: a symbolic link."""

    path: str | None = None
    dest: str | None = None
    points_to: str | None = None
    reason: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class PullPlan(WireRecord):
    """pull-plan: the run's output folder, its complete checkpoints (`steps`) and the ones chosen, the export
    folder (and whether it is ready), and the files to fetch; no such checkpoint: code bad_usage."""

    SKIP_NONE = FAILURE

    ok: bool = False
    output_dir: str | None = None
    checkpoints: tuple = each()
    steps: tuple = each()
    export_dir: str | None = None
    export_ready: bool = False
    files: tuple = each(PlanFile)
    skipped: tuple = each(SkippedPath)
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class CleanupAction(WireRecord):
    """Something cleanup did (or, with --dry-run, would do): mark a run lost, end an orphan or a stuck parent."""

    action: str = ""
    done: bool = False
    ok: bool = False
    description: str = ""
    extra: dict = extra_keys()

    def shown(self) -> str:
        """Its line in the CLI and the dashboard alike."""
        return self.description or self.action


@dataclass(frozen=True)
class Finding(WireRecord):
    """Something cleanup cannot fix from where it runs, of a `kind`, with what to do about it (`advice`)."""

    SKIP_NONE = ("advice",)

    kind: str = ""
    description: str = ""
    advice: str | None = None
    extra: dict = extra_keys()

    def shown(self) -> str:
        """Its line in the CLI and the dashboard alike."""
        return self.description or self.kind


@dataclass(frozen=True)
class ForeignZombies(WireRecord):
    """Zombies of a process no run owns (never acted on): their parent, their pids."""

    parent: ProcessInfo = of(ProcessInfo)
    pids: tuple = each()
    count: int = 0
    advice: str | None = None
    description: str = ""
    extra: dict = extra_keys()


@dataclass(frozen=True)
class CleanupAnswer:
    """cleanup: what it did, what it found it cannot fix, foreign zombies, the GPUs as nvidia-smi showed them
    (`{"available", "gpus", "error"}`) and the runs it left alone because they live; ok unless an action failed."""

    ok: bool = False
    dry_run: bool = False
    actions: tuple = each(CleanupAction)
    findings: tuple = each(Finding)
    foreign_zombies: tuple = each(ForeignZombies)
    gpus: dict | None = None
    live_runs: tuple = each()
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()

    @classmethod
    def from_dict(cls, data) -> CleanupAnswer:
        if isinstance(data, dict) and "findings" not in data and "unfixable" in data:  # an older agent's name
            data = {("findings" if key == "unfixable" else key): value for key, value in data.items()}
        return decode(cls, data)

    def summary(self, target: str) -> str:
        """The one line a cleanup's result starts with, in the CLI and the dashboard alike."""
        count = len(self.actions)
        if not count:
            return "{}: nothing to clean".format(target)
        return "{}: {} action{} {}".format(target, count, "s" if count != 1 else "",
                                           "planned" if self.dry_run else "taken")

    def foreign_advice(self) -> list:
        """The advice on foreign zombies, each said once: it is the same for every parent."""
        return list(dict.fromkeys(entry.advice for entry in self.foreign_zombies if entry.advice))

    def to_dict(self) -> dict:
        return encode(self, skip_none=FAILURE)


@dataclass(frozen=True)
class ProbeFacts(WireRecord):
    """What doctor judges in a container: device nodes, the driver library, cgroup limits, the filesystems of
    the workdir, /dev/shm and the config's paths, the GPU sets of live runs, and the model's config and size
    (with --model). `live_gpus` is None from an agent that did not say."""

    SKIP_NONE = ("live_gpus", "model")

    devices: dict | None = None
    nvml: dict | None = None
    limits: dict | None = None
    workdir: dict | None = None
    shm: dict | None = None
    paths: dict | None = None
    live_gpus: tuple | None = each(optional=True)
    model: dict | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class ProbeAnswer(WireRecord):
    """probe: the facts doctor judges."""

    SKIP_NONE = FAILURE

    ok: bool = False
    probe: ProbeFacts = of(ProbeFacts)
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


__all__ = ["CleanupAction", "CleanupAnswer", "Finding", "ForeignZombies", "PlanFile", "ProbeAnswer", "ProbeFacts",
           "PullPlan", "SkippedPath"]


@dataclass(frozen=True)
class PackagesAnswer(WireRecord):
    """packages: whether the trainer package was installed now (it may have been there already) and the versions
    removed beside it, as nothing uses them."""

    SKIP_NONE = FAILURE

    ok: bool = False
    installed: bool = False
    removed: tuple = each()
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class VersionAnswer(WireRecord):
    """version: the agent's version and the Python that runs it."""

    SKIP_NONE = FAILURE

    ok: bool = False
    agent_version: str = ""
    python: str = ""
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()
