"""Doctor's checks of what dflashctl itself keeps on a target: its deployed agent (intact or not) and the room its
runs' logs and state have left. Each fills its field of the report and adds warnings; none stops doctor."""
from __future__ import annotations

from typing import Protocol

from ...inventory.model import Target
from ...transports.base import Transport
from ..deploy import agent_path_in, present
from .storage import LOW_FREE_BYTES, LOW_FREE_FRACTION


class AgentReport(Protocol):
    agent: str | None
    warnings: list[str]


def check_agent(transport: Transport, target: Target, report: AgentReport) -> None:
    """The deployed agent of this version: `ok` (its content hash is its name's), `absent` (sent at first use)
    or `damaged` (an upload cut short; the next command replaces it)."""
    have = present(transport, target.workdir)
    report.agent = "ok" if "agent" in have else "damaged" if "agent-damaged" in have else "absent"
    if report.agent == "damaged":
        report.warnings.append(f"{agent_path_in(target.workdir)} is damaged (its content is not what its name "
                               f"promises); the next launch, ps or watch replaces it")




class SpaceReport(Protocol):
    free_bytes: int | None
    warnings: list[str]


def parse_df(text: str) -> tuple[int, int] | None:
    """(free bytes, total bytes) from `df -Pk DIR`'s last line, None when it is not one."""
    fields = (text.strip().splitlines() or [""])[-1].split()
    try:
        return int(fields[3]) * 1024, int(fields[1]) * 1024
    except (IndexError, ValueError):
        return None


def low_space(free: int, total: int) -> bool:
    return free < LOW_FREE_BYTES or (total > 0 and free < LOW_FREE_FRACTION * total)


def check_free_space(transport: Transport, target: Target, report: SpaceReport) -> None:
    """Free space of the filesystem that holds the workdir (the runs, their logs and checkpoints)."""
    result = transport.run(["df", "-Pk", target.workdir], timeout=30)
    space = parse_df(result.out) if result.ok else None
    if space is None:
        report.warnings.append(f"cannot measure the free space of {target.workdir}: {result.describe()}")
        return
    report.free_bytes = space[0]
    if low_space(*space):
        report.warnings.append(f"{target.workdir} has only {space[0] / 1024 ** 3:.1f} GiB free of "
                               f"{space[1] / 1024 ** 3:.1f} GiB: a run that fills it loses its log")
