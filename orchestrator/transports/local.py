"""Commands on this machine, for the `local` host and for tests."""
from __future__ import annotations

import os
import select
import subprocess
from typing import Sequence

from ..errors import CommandTimeout, TransportError
from .base import DEFAULT_TIMEOUT, CommandResult, RemoteProcess, Transport, shown_argv
from .shortage import out_of_resources


class LocalTransport(Transport):
    def __init__(self, label: str = "local") -> None:
        self.label = label

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT) -> CommandResult:
        argv = tuple(argv)
        try:
            done = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                  timeout=timeout, check=False)
        except FileNotFoundError:
            # what a shell would say, so callers treat "not installed" the same on every transport
            return CommandResult(argv, 127, b"", f"{argv[0]}: command not found\n".encode())
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(f"{self.label}: {shown_argv(argv)} did not finish in {timeout:g}s") from exc
        except OSError as exc:
            raise _cannot_run(self.label, argv[0], exc) from exc
        return CommandResult(argv, _exit_code(done.returncode), done.stdout, done.stderr)

    def start(self, argv: Sequence[str]) -> RemoteProcess:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise _cannot_run(self.label, argv[0], exc) from exc
        return LocalProcess(proc, self.label)


def _cannot_run(label: str, program: str, exc: OSError) -> TransportError:
    """A program that could not be started; for want of file descriptors or processes, that target alone could
    not be read (OutOfResources, exit 3), as with an SSH target."""
    short = out_of_resources(label, exc, f"and cannot run {program}")
    if short is not None:
        return short
    return TransportError(f"{label}: cannot run {program}: {exc.strerror or exc}")


class LocalProcess(RemoteProcess):
    def __init__(self, proc: subprocess.Popen, label: str) -> None:
        self._proc = proc
        self._label = label

    def read(self, timeout: float | None = None) -> bytes:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise CommandTimeout(f"{self._label}: no output in {timeout:g}s")
        return os.read(fd, 65536)

    def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except BrokenPipeError as exc:
            raise TransportError(f"{self._label}: the command closed its input") from exc

    def close_stdin(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()

    def poll(self) -> int | None:
        code = self._proc.poll()
        return None if code is None else _exit_code(code)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream and not stream.closed:
                stream.close()


def _exit_code(returncode: int) -> int:
    """Shell convention: a command killed by signal N exits 128+N."""
    return 128 - returncode if returncode < 0 else returncode
