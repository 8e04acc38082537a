"""A doctor's report: one row per check (ok / warn / fail, what was found, the fix in one line) per target."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dflash_records.gpu import GpuRow

from ...errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE

OK, WARN, FAIL = "ok", "warn", "fail"

# What only the Proxmox host can fix is explained step by step in one guide; a fix line ends by naming its
# section. tests/test_docs.py checks that the page and every anchor here exist.
GUIDE_PAGE = "docs/proxmox.md"
GUIDE_SECTIONS = {
    "driver": "the-driver-twice-the-same-version",
    "devices": "the-device-nodes",
    "tmpfs": "nothing-you-want-to-keep-on-tmpfs",
    "shm": "enough-devshm",
    "room": "room-in-the-workdir",
    "limits": "cpus-and-memory",
    "held": "gpus-nobody-owns",
}


def see(topic: str) -> str:
    """The pointer a fix line ends with: `see docs/proxmox.md#<section>`."""
    return f"see {GUIDE_PAGE}#{GUIDE_SECTIONS[topic]}"


@dataclass(frozen=True)
class Row:
    name: str
    status: str          # ok / warn / fail
    detail: str          # what was found
    fix: str = ""        # one line: what to do about it (empty when ok)

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"{self.name}: {self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class DoctorReport:
    target: str
    ok: bool = False
    error: str | None = None
    unreachable: bool = False
    reachable: bool | None = None
    host_key_ok: bool | None = None
    auth_ok: bool | None = None
    pct: bool | None = None          # None where the target has no container
    container: str | None = None     # running / stopped / missing
    python: str | None = None
    nvidia_smi: bool | None = None
    gpus: list[GpuRow] | None = None
    cache_dir: str | None = None
    cache_bytes: int | None = None   # 0 where nothing was compiled there yet
    agent: str | None = None         # the deployed agent: ok / absent / damaged (ownfiles.py)
    free_bytes: int | None = None    # free space of the workdir's filesystem (ownfiles.py)
    warnings: list[str] = field(default_factory=list)
    checks: list[Row] = field(default_factory=list)
    elapsed_ms: int = 0

    def add(self, row: Row | None) -> None:
        if row is not None:
            self.checks.append(row)

    @property
    def exit_code(self) -> int:
        """This target's part of doctor's exit code: 3 unreachable, 1 a check failed, 0 ok."""
        return EXIT_UNREACHABLE if self.unreachable else EXIT_OK if self.ok else EXIT_FAILED

    def failed(self) -> list[Row]:
        return [row for row in self.checks if row.status == FAIL]

    def as_dict(self) -> dict:
        return {**asdict(self), "checks": [row.as_dict() for row in self.checks]}
