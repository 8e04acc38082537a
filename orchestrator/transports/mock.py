"""A transport double for tests of code above the transports: answers from a function, records every call."""
from __future__ import annotations

from typing import Callable, Sequence

from .base import DEFAULT_TIMEOUT, CommandResult, RemoteProcess, Transport

Handler = Callable[[tuple[str, ...], "bytes | None"], CommandResult]


class MockTransport(Transport):
    def __init__(self, handler: Handler, label: str = "mock") -> None:
        self.handler = handler
        self.label = label
        self.calls: list[tuple[tuple[str, ...], bytes | None]] = []

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT) -> CommandResult:
        argv = tuple(argv)
        self.calls.append((argv, stdin))
        return self.handler(argv, stdin)

    def start(self, argv: Sequence[str]) -> RemoteProcess:
        raise NotImplementedError("MockTransport does not stream; use LocalTransport for streaming tests")


def answer(stdout: str = "", *, code: int = 0, stderr: str = "") -> Callable[[tuple[str, ...]], CommandResult]:
    """A CommandResult factory for handlers: `answer("3.11.7\\n")(argv)`."""
    return lambda argv: CommandResult(argv, code, stdout.encode(), stderr.encode())
