"""The one exception root of dflashctl, and the exit code each kind of failure maps to.

Third-party errors (paramiko, socket, subprocess, pydantic, yaml) are converted into these at the boundary
where they happen; nothing else escapes orchestrator/. Only the CLI root turns them into exit codes.
"""
from __future__ import annotations

from collections.abc import Iterable

# the exit codes live with the agent's, which shares the first three: the CLI's callers import them from here
from dflash_records.protocol import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "DflashError", "OperationFailed",
           "UsageError", "InventoryError", "TargetNotFound", "TransportError", "CommandTimeout", "Unreachable",
           "HostKeyError", "AuthError", "OutOfResources", "shorten", "worst_exit_code"]

MAX_ECHO = 200  # characters of the user's input that a message repeats


def shorten(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut in the middle past `limit` characters: a 100 KB argument is not worth repeating whole."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}...({len(text) - 2 * keep} more characters)...{text[-keep:]}"


def worst_exit_code(codes: Iterable[int]) -> int:
    """One exit code for a command over many targets: the worst of theirs, where an unreachable target (3)
    outranks a usage error (2), which outranks a failure (1); EXIT_OK when there were none."""
    return max(codes, default=EXIT_OK)


class DflashError(Exception):
    """Root of every error dflashctl raises on purpose."""

    exit_code = EXIT_FAILED


class OperationFailed(DflashError):
    """The operation ran but did not succeed (a run failed, something survived a kill)."""


class UsageError(DflashError):
    """Bad arguments, a bad inventory or config: the user can fix it by changing what they typed."""

    exit_code = EXIT_USAGE


class InventoryError(UsageError):
    """The inventory file is invalid. The message names the file, the line and the field."""


class TargetNotFound(UsageError):
    """A TARGET or RUN that the inventory or the hosts do not know."""


class TransportError(DflashError):
    """A command could not be run or its output could not be read."""


class Unreachable(TransportError):
    """The host cannot be reached or will not let us in (network, host key, authentication)."""

    exit_code = EXIT_UNREACHABLE


class CommandTimeout(Unreachable):
    """A remote command did not finish within its timeout: the target is stuck (a hung `pct exec`, a frozen
    container, a host swapping hard), which is as much an outage as a dead link: exit 3, never "no run"."""


class HostKeyError(Unreachable):
    """The host's key is unknown or does not match known_hosts."""


class AuthError(Unreachable):
    """The host refused every credential we offered."""


class OutOfResources(Unreachable):
    """The controller ran short of file descriptors or threads while reaching a target: that target could not
    be read (exit 3), the others are not held back."""
