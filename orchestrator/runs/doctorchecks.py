"""Doctor's checks of what dflashctl itself keeps on a target (its deployed agent), apart from doctor.py's
checks of what the target provides. Each fills its fields of the report and adds warnings; none stops doctor."""
from __future__ import annotations

from typing import Protocol

from ..inventory.model import Target
from ..transports.base import Transport
from .deploy import agent_path_in, present


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
