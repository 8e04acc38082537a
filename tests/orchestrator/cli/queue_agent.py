"""A stand-in for the agent's side of the GPU queue (issue 53's contract), for tests of the controller's side
before and beside the real one: each subcommand answers the typed JSON the contract gives, from what the test
set, and every call's arguments are kept. nvidia-smi answers with the GPUs it is given. Nothing else runs."""
from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dflash_records.protocol import PROTOCOL_VERSION, QUEUED
from orchestrator.transports.base import CommandResult
from orchestrator.transports.mock import MockTransport
from orchestrator.transports.pool import Connections

AGENT_ARGS_AT = 8  # sh -c CHECKED_CALL sh PATH SIZE SHA256 PYTHON, then the agent's arguments (agentcall.py)


def queued_run(run_id: str, *, position: int, gpus: list | None = None, gpu_count: int | None = None,
               **more) -> dict:
    """A queued run's record, as the agent's launch and ps give it."""
    return {"run_id": run_id, "name": run_id.split("-")[0], "state": QUEUED, "queue_position": position,
            "gpus": gpus, "gpu_count": gpu_count, "queued_at": "2026-05-01T12:00:00.000Z",
            "created_at": "2026-05-01T12:00:00.000Z", **more}


class QueueAgent:
    """Every target's agent: `answers` maps a subcommand to its answer (without "version") from the call's
    arguments and the target's name."""

    def __init__(self, *, gpus: int = 8, **answers: Callable[[list[str], str], dict]) -> None:
        self.gpus = gpus
        self.answers = answers
        self.calls: list[list[str]] = []      # the agent's arguments of each call, in order
        self.commands: list[tuple[str, ...]] = []  # every command any target ran (nvidia-smi too)

    def subcommands(self) -> list[str]:
        return [args[0] for args in self.calls]

    def transport(self, target: str) -> MockTransport:
        return MockTransport(lambda argv, stdin: self._run(target, argv))

    def _run(self, target: str, argv: tuple[str, ...]) -> CommandResult:
        self.commands.append(argv)
        if argv[0] == "nvidia-smi":
            rows = "".join(f"{index}\n" for index in range(self.gpus))
            return CommandResult(argv, 0, rows.encode(), b"")
        args = list(argv[AGENT_ARGS_AT:])
        self.calls.append(args)
        answer = self.answers.get(args[0])
        if answer is None:
            raise AssertionError(f"the stand-in agent was not told how to answer {args[0]!r}")
        payload = {"version": PROTOCOL_VERSION, **answer(args, target)}
        return CommandResult(argv, 0, json.dumps(payload).encode(), b"")


def option(args: list[str], name: str) -> str | None:
    """The value after `name` in an agent call's arguments (before `--`)."""
    head = args[:args.index("--")] if "--" in args else args
    return head[head.index(name) + 1] if name in head else None


@pytest.fixture
def agent_for(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Have every target's transport in this test be the stand-in agent it returns (`agent_for(**answers)`); the
    run cache (whereabouts) is kept under tmp_path."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def install(**answers) -> QueueAgent:
        agent = QueueAgent(**answers)
        monkeypatch.setattr(Connections, "for_target", lambda self, target: agent.transport(target.name))
        return agent

    return install
