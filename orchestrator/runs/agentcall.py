"""How the controller calls the agent: the command line of a subcommand on a target, and its one JSON answer
(checked for the protocol version, with bad input raised as the usage error it is).

A call carries what the deployed agent must be (its path, size and sha256) and is checked on the target in the
same command, so a command costs one session per target: a short shell looks at the file and, when it is this
version's whole agent, becomes the agent (exec); otherwise it answers NEEDS_DEPLOY and the caller deploys and
asks again. Only a target without this version pays for a second command.
"""
from __future__ import annotations

import json

from dflash_records.protocol import EXIT_USAGE, NEEDS_DEPLOY, PROTOCOL_VERSION, UNKNOWN_RUN, USAGE_CODES

from ..errors import TargetNotFound, TransportError, UsageError
from ..inventory.model import Target
from ..transports.base import CommandResult

# $1 agent path, $2 its size, $3 its sha256, $4 python, then the agent's arguments. Without sha256sum the size
# must do. The refusal reads its stdin to the end, so a caller that sends input finds someone taking it.
CHECKED_CALL = (
    'a=$1 n=$2 h=$3 p=$4; shift 4; w=absent; if [ -f "$a" ]; then w=damaged; '
    'if [ $(($(wc -c < "$a"))) -eq "$n" ]; then command -v sha256sum >/dev/null 2>&1 || exec "$p" "$a" "$@"; '
    's=$(sha256sum < "$a"); [ "${s%%%% *}" = "$h" ] && exec "$p" "$a" "$@"; fi; fi; '
    'printf \'{"version": %d, "ok": false, "code": "%s", "agent": "%%s"}\\n\' "$w"; cat >/dev/null'
    % (PROTOCOL_VERSION, NEEDS_DEPLOY))


def agent_argv(target: Target, agent_path: str, *args: str) -> list[str]:
    """How every agent subcommand is started on a target: its python, the deployed zipapp, the arguments."""
    return [target.python, agent_path, *args]


def checked_agent_argv(target: Target, agent_path: str, size: int, sha256: str, *args: str) -> list[str]:
    """An agent subcommand that runs only if the agent at `agent_path` is the one of this size and hash, and
    answers NEEDS_DEPLOY (with `agent`: absent or damaged) otherwise; one remote command either way."""
    return ["sh", "-c", CHECKED_CALL, "sh", agent_path, str(size), sha256, target.python, *args]


def needs_deploy(payload: dict) -> bool:
    return payload.get("code") == NEEDS_DEPLOY


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


__all__ = ["agent_argv", "agent_answer", "checked_agent_argv", "needs_deploy"]
