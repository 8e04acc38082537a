"""The trainer's own error types (the trainer never imports orchestrator), and the conversion of an OS error about
a path the user named into one."""
from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


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


def why_not(path: str | Path, exc: OSError) -> str:
    """Why an OS call on `path` failed, in words: a path under a regular file names that file, since the
    system's own "Not a directory" (or "File exists", from mkdir -p) does not say which part is wrong."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        for parent in Path(path).parents:
            if parent.exists() and not parent.is_dir():
                return f"{parent} is a file, not a directory"
    return exc.strerror or str(exc)


@contextmanager
def about_path(path: str | Path, doing: str) -> Iterator[None]:
    """An OSError inside the block becomes a TrainerError (exit 2, one line): `cannot {doing} {path}: why`.
    For the paths a user names on the command line, where such an error is bad input, not a crash."""
    try:
        yield
    except OSError as exc:
        raise TrainerError(f"cannot {doing} {path}: {why_not(path, exc)}") from None
