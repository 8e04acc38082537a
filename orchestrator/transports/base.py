"""The transport interface: run a command, start a streaming one, send a file.

Commands are argv lists, never shell strings. Each transport is responsible for getting the argv to the other
end unchanged (the SSH transport quotes it for the remote shell; `pct exec` passes it on without a shell).
"""
from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass
from typing import Sequence

from ..errors import TransportError
from .timeouts import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def program_missing(self) -> bool:
        """The shell could not find (127) or run (126) the program: it is not there, not that it failed."""
        return self.exit_code in (126, 127)

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def describe(self) -> str:
        """One line for an error message: the command, its exit code and the end of its stderr. A shell script
        of ours (`sh -c SCRIPT`) is not quoted: what it was for is said around this, what went wrong by its
        last line."""
        tail = self.err.strip().splitlines()[-1:] or self.out.strip().splitlines()[-1:]
        if tuple(self.argv[:2]) == ("sh", "-c"):
            return f"{tail[0]} (exit {self.exit_code})" if tail else f"exit {self.exit_code}"
        return f"{shown_argv(self.argv)} exited {self.exit_code}" + (f": {tail[0]}" if tail else "")


def shown_argv(argv: Sequence[str]) -> str:
    """A command as an error message names it, in at most ~120 characters: a shell script of ours (`sh -c SCRIPT
    NAME ARGS...`) by its arguments alone (the agent's subcommand among them), a hash by its first 12 digits."""
    words = list(argv)
    if words[:2] == ["sh", "-c"]:
        words = ["sh -c \u2026", *words[4:]]
    words = [w[:12] + "\u2026" if len(w) == 64 and all(c in "0123456789abcdef" for c in w) else w for w in words]
    return "`" + " ".join(words)[:120] + "`"


class RemoteProcess(abc.ABC):
    """A started command whose output is read as it comes."""

    @abc.abstractmethod
    def read(self, timeout: float | None = None) -> bytes:
        """The next chunk of stdout; b"" at end of stream; raises CommandTimeout if nothing came in time."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def close_stdin(self) -> None: ...

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code once the command has ended, else None."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the command (if still running) and release the channel."""


# $1 path, $2 mode, $3 size, $4 sha256. sha256sum is in coreutils and busybox; without it the size must do.
WRITE_VERIFIED = (
    'set -e; d=$(dirname -- "$1"); mkdir -p -- "$d"; t="$1.tmp.$$"; trap \'rm -f -- "$t"\' EXIT; cat > "$t"; '
    'n=$(($(wc -c < "$t"))); if [ "$n" -ne "$3" ]; then echo "upload cut short: $n of $3 bytes arrived" >&2; '
    'exit 3; fi; if command -v sha256sum >/dev/null 2>&1; then h=$(sha256sum < "$t"); h=${h%% *}; '
    'if [ "$h" != "$4" ]; then echo "upload damaged: sha256 $h, sent $4" >&2; exit 3; fi; fi; '
    'chmod "$2" "$t"; mv -f -- "$t" "$1"; trap - EXIT')


def write_file_argv(path: str, data: bytes, mode: int) -> list[str]:
    """The command that receives `data` on stdin and installs it at `path` only if all of it arrived."""
    return ["sh", "-c", WRITE_VERIFIED, "sh", path, format(mode, "o"), str(len(data)),
            hashlib.sha256(data).hexdigest()]


class Transport(abc.ABC):
    """Where commands run: this machine, an SSH host, or a container of one."""

    label: str

    @abc.abstractmethod
    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT) -> CommandResult:
        """Run argv to completion and return its exit code and output."""

    @abc.abstractmethod
    def start(self, argv: Sequence[str]) -> RemoteProcess:
        """Start argv and return a handle to stream its output."""

    def write_file(self, path: str, data: bytes, *, mode: int = 0o644, timeout: float | None = 300.0) -> None:
        """Write `data` to `path` atomically through the command channel: to a temp name, then renamed only once
        its size and content hash on the target are what was sent (a cut upload leaves nothing behind)."""
        result = self.run(write_file_argv(path, data, mode), stdin=data, timeout=timeout)
        if not result.ok:
            raise TransportError(f"{self.label}: cannot write {path}: {result.describe()}")

    def close(self) -> None:
        """Release what the transport holds (connections are shared and closed by their pool)."""
