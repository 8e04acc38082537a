"""The trainer's own error type (the trainer never imports orchestrator)."""
from __future__ import annotations


class TrainerError(Exception):
    """A user-facing error: the entry point prints the message and exits 2, without a traceback."""
