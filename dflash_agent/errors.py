"""The agent's own error type: it runs alone inside the container, so it cannot import the controller's."""
from __future__ import annotations

from dflash_records.protocol import EXIT_FAILED, EXIT_USAGE


class AgentError(Exception):
    """An error reported as `{"ok": false, "error": message, "code": code}` with its exit status."""

    exit_status = EXIT_FAILED

    def __init__(self, message: str, *, code: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details or {}


class BadInput(AgentError):
    """The caller passed something invalid (a bad run id, an unknown run, a malformed option)."""

    exit_status = EXIT_USAGE


class OperationFailed(AgentError):
    """The request was valid but the operation did not succeed."""
