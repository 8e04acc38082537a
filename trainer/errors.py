"""The trainer's own error types (the trainer never imports orchestrator)."""
from __future__ import annotations

from dataclasses import dataclass


class TrainerError(Exception):
    """A user-facing error: the entry point prints the message and exits 2, without a traceback."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: the key it is about and a message that names it."""

    key: str
    message: str
    needs: tuple[str, ...] = ()   # other keys the check read: it means nothing when one of them is invalid

    def __str__(self) -> str:
        return self.message


class ConfigError(TrainerError):
    """Every problem of one config; str() is one line per problem, each starting with the config's name."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source, self.problems = source, list(problems)
        super().__init__("\n".join(f"{source}: {problem}" for problem in self.problems))
