"""Doctor's checks of what dflashctl itself keeps on a target: its deployed agent (intact or not) and the room its
runs' logs and state have left. Each fills its field of the report and adds warnings; none stops doctor."""
from __future__ import annotations

from typing import Protocol

from dflash_records.protocol import GIB, KIB, low_free

from ...inventory.model import Target
from ...transports.base import Transport
from ...transports.timeouts import PROBE_TIMEOUT_S
from ..deploy import agent_path_in, present


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
        return int(fields[3]) * KIB, int(fields[1]) * KIB
    except (IndexError, ValueError):
        return None


def check_free_space(transport: Transport, target: Target, report: SpaceReport, measured: dict | None) -> None:
    """Free space of the filesystem that holds the workdir (the runs, their logs and checkpoints), as the
    agent's probe measured it for the `workdir` row; `df` only where the probe could not run (a disk too full
    to take the agent is the case that matters most)."""
    space = None
    if measured and measured.get("free_bytes") is not None:
        space = (int(measured["free_bytes"]), int(measured.get("total_bytes") or 0))
    else:
        result = transport.run(["df", "-Pk", target.workdir], timeout=PROBE_TIMEOUT_S)
        space = parse_df(result.out) if result.ok else None
        if space is None:
            report.warnings.append(f"cannot measure the free space of {target.workdir}: {result.describe()}")
            return
    report.free_bytes = space[0]
    if low_free(*space):
        report.warnings.append(f"{target.workdir} has only {space[0] / GIB:.1f} GiB free of "
                               f"{space[1] / GIB:.1f} GiB: a run that fills it loses its log")
