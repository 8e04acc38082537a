"""A stand-in for the agent's side of the GPU queue (issue 53's contract), for tests of the controller's side
before and beside the real one: each subcommand answers the typed JSON the contract gives, from what the test
set, and every call's arguments are kept. nvidia-smi answers with the GPUs it is given. Nothing else runs."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from dflash_records.protocol import PROTOCOL_VERSION, QUEUED
from dflash_records.queueinfo import QueueAnswer
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


CHECKED = {"exit_code": 0, "stdout": json.dumps({"ok": True, "problems": []}), "stderr": ""}


class Fleet:
    """Every target's agent one level up, as RunClient.agent (the one call every agent subcommand goes through):
    each target's queue answer (or an exception to raise), a check that passes, and a launch that takes its
    --gpu-count of the target's free GPUs (all of them without one) or queues when too few are free; every call
    is kept, by target."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.free = {name: list(a.gpus_free) for name, a in answers.items() if isinstance(a, QueueAnswer)}
        self.calls: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    def agent(self, client, target, args, **_):
        with self.lock:
            self.calls.append((target.name, list(args)))
        if args[0] == "queue":
            answer = self.answers[target.name]
            if isinstance(answer, Exception):
                raise answer
            return {"version": PROTOCOL_VERSION, **answer.to_dict()}
        if args[0] == "check":
            return {"version": PROTOCOL_VERSION, "ok": True, "check": CHECKED}
        assert args[0] == "launch"
        head = args[:args.index("--")] if "--" in args else args
        with self.lock:
            free = self.free.get(target.name, [])
            count = int(head[head.index("--gpu-count") + 1]) if "--gpu-count" in head else len(free)
            taken, self.free[target.name] = (free[:count], free[count:]) if free and len(free) >= count \
                else (None, free)
        run = {"run_id": head[head.index("--run-id") + 1], "target": target.name, "name": "sw",
               "state": "running" if taken is not None else QUEUED, "gpus": taken}
        return {"version": PROTOCOL_VERSION, "ok": True, "run": run}

    def asked(self, command: str) -> list[str]:
        """The targets asked this subcommand, sorted."""
        return sorted(name for name, args in self.calls if args[0] == command)

    def launches(self) -> list[tuple[str, list[str]]]:
        return [(name, args) for name, args in self.calls if args[0] == "launch"]
