"""How the controller calls the agent: the command line of a subcommand on a target, and its one JSON answer
(checked for the protocol version, with bad input raised as the usage error it is)."""
from __future__ import annotations

import json

from ..agent.protocol import EXIT_USAGE, PROTOCOL_VERSION, UNKNOWN_RUN, USAGE_CODES
from ..errors import TargetNotFound, TransportError, UsageError
from ..inventory.model import Target
from ..transports.base import CommandResult


def agent_argv(target: Target, agent_path: str, *args: str) -> list[str]:
    """How every agent subcommand is started on a target: its python, the deployed zipapp, the arguments."""
    return [target.python, agent_path, *args]


def agent_answer(target: Target, result: CommandResult) -> dict:
    """The agent's one JSON answer, checked for the protocol version; bad input raised as the usage error it is."""
    payload = _agent_json(result.out)
    if payload is None:
        raise TransportError(f"{target.name}: the agent gave no answer ({result.describe()})")
    if payload.get("version") != PROTOCOL_VERSION:
        raise TransportError(f"{target.name}: the agent speaks protocol {payload.get('version')!r}, this dflashctl "
                             f"{PROTOCOL_VERSION}")
    if result.exit_code == EXIT_USAGE or payload.get("code") in USAGE_CODES:
        raise (TargetNotFound if payload.get("code") == UNKNOWN_RUN else UsageError)(
            f"{target.name}: {payload.get('error', 'bad input')}")
    return payload


def _agent_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


__all__ = ["agent_argv", "agent_answer"]
