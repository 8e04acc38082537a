"""The agent's typed answers: each codec keeps what it does not know and tolerates what is missing; a controller of
this version parses every answer of the last version's agent (its answers recorded in old_agent_answers.json by
wire_scenario.py); and this agent answers in the shape that agent did (keys added, never renamed or dropped)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_records.answers import (CheckAnswer, KillAnswer, LaunchAnswer, LinesAnswer, NetInfo, PsAnswer,
                                    RelaunchAnswer)
from dflash_records.plans import CleanupAnswer, ProbeAnswer, PullPlan
from dflash_records.run import RunRecord
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.bundle import build_zipapp
from orchestrator.runs.client import RelaunchFailed, RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.base import CommandResult
from orchestrator.transports.mock import MockTransport
from tests.dflash_records.wire_scenario import WORKDIR, record_answers, shape
from tests.lab.workloads import write_local_inventory

OLD = json.loads((Path(__file__).parent / "old_agent_answers.json").read_text())
TYPES = {"launch": LaunchAnswer, "launch_ended": LaunchAnswer, "ps": PsAnswer, "lines": LinesAnswer,
         "pull_plan": PullPlan, "relaunch_refused": RelaunchAnswer, "check": CheckAnswer, "netinfo": NetInfo,
         "probe": ProbeAnswer, "kill": KillAnswer, "cleanup": CleanupAnswer}


def holds(whole, part) -> bool:
    """Whether `whole` holds every key of `part` with the same value, all the way down."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(key in whole and holds(whole[key], v) for key, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and len(whole) == len(part) and all(map(holds, whole, part))
    return whole == part


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_every_old_answer_reads_typed_and_writes_back_whole(kind: str) -> None:
    answer = TYPES[kind].from_dict(OLD[kind])
    assert answer.ok == OLD[kind]["ok"]
    assert holds(json.loads(json.dumps(answer.to_dict())), OLD[kind]), kind  # nothing lost, nothing renamed


@pytest.mark.parametrize("kind", sorted(set(TYPES.values()), key=lambda t: t.__name__))
def test_a_codec_keeps_unknown_keys_and_defaults_missing_ones(kind) -> None:
    newer = kind.from_dict({"ok": True, "from_a_newer_agent": {"x": 1}})
    assert newer.ok and newer.to_dict()["from_a_newer_agent"] == {"x": 1}
    for garbage in (None, [], "x", {"ok": False, "runs": "not a list", "run": 3, "files": None}):
        assert kind.from_dict(garbage).ok is False


class Replay:
    """The target's agent answering as the last version's did (MockTransport), by subcommand and run id."""

    def __init__(self) -> None:
        self.transport = MockTransport(self.answer)

    def for_target(self, target):
        return self.transport

    @staticmethod
    def answer(argv: tuple, stdin: bytes | None) -> CommandResult:
        args = argv[8:]  # the checked call's sh -c SCRIPT sh AGENT SIZE SHA256 PYTHON, then the agent's arguments
        kind = {"launch": "launch_ended" if "saved" in args else "launch", "pull-plan": "pull_plan",
                "relaunch": "relaunch_refused"}.get(args[0], args[0])
        payload = OLD[kind]
        return CommandResult(argv, 0 if payload["ok"] else 1, json.dumps(payload).encode(), b"")


def test_a_controller_of_this_version_reads_every_answer_of_the_last_agent(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # whereabouts, noted by launch and ps
    inventory = load_inventory(Path(write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")))
    target = inventory.target("local")
    client = RunClient(inventory, Replay())
    live = client.launch(LaunchSpec(target, ["sleep", "60"], "wire", run_id="live", gpus=[]))
    assert (live.run_id, live.state) == ("live", "running") and live.pid
    ended = client.launch(LaunchSpec(target, ["true"], "wire", run_id="saved", gpus=[]))  # exit 0 at once: no failure
    assert ended.ended_text() == "succeeded, exit code 0"
    runs = {run.run_id: run for run in client.runs_on(target, tail_bytes=4096)}
    assert (runs["live"].last_step, runs["live"].tok_per_s, runs["saved"].state) == (1, 11700.0, "succeeded")
    assert list(client.log_lines(target, "live", 0, 5).lines)[0].startswith("[1s] step=1")
    plan = client.pull_plan(target, ["--run-id", "saved"])
    assert {f.dest for f in plan.files} >= {"step_1/config.json", "train.log"} and plan.checkpoints == ("step_1",)
    assert [f.prefix_size for f in plan.files if f.dest == "train.log"] == [1]
    with pytest.raises(RelaunchFailed) as refused:
        client.relaunch(target, "saved", name="wire", new_id="s2")
    assert refused.value.code == "not_relaunched"
    assert client.netinfo(target, "127.0.0.1", free_port=True).port > 0
    facts = client.probe(target, []).probe
    assert facts.live_gpus is not None and facts.workdir["path"] == WORKDIR
    (killed,) = client.kill(target, ["live"], grace=1).runs
    assert killed.ok and killed.record().ended_text().startswith("killed, signal 15 (SIGTERM)")
    assert client.cleanup(target, dry_run=True).summary("local") == "local: nothing to clean"


def test_this_agent_answers_in_the_shape_the_last_one_did(tmp_path) -> None:
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(build_zipapp())
    new = record_answers(str(agent), tmp_path / "work")
    for kind, old in OLD.items():
        assert holds_shape(shape(new[kind]), shape(old)), kind


def holds_shape(whole, part) -> bool:
    """Whether shape `whole` has every key of shape `part`, all the way down, each of the same type. A list's items
    are compared however many there are (a log tail's length is timing), an empty one holds any; a null value on
    either side says no type, but where the old one had an object or a list the new one must too."""
    if part is None:
        return True
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(key in whole and holds_shape(whole[key], v) for key, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and (whole[0] is None or holds_shape(whole[0], part[0]))
    return whole is None or (isinstance(whole, frozenset) and whole <= part)


def test_a_shape_is_held_whatever_a_list_s_length_and_not_when_a_key_is_renamed_dropped_or_retyped() -> None:
    old = shape({"ok": False, "exit_code": 0, "tail": ["a", "b"], "runs": [{"id": "x", "pid": 1}], "error": None})
    same = {"ok": True, "exit_code": None, "tail": [], "runs": [{"id": "y", "pid": 2, "new": 1}], "error": "e"}
    assert holds_shape(shape(same), old)
    assert holds_shape(shape({**same, "tail": ["a"]}), old) and holds_shape(shape({**same, "runs": []}), old)
    renamed = {("exit" if key == "exit_code" else key): value for key, value in same.items()}
    for changed in (renamed, {key: value for key, value in same.items() if key != "tail"},
                    {**same, "runs": [{"run_id": "y", "pid": 2}]}, {**same, "exit_code": "0"},
                    {**same, "tail": [1]}, {**same, "tail": "a"}, {**same, "runs": [{"id": "y", "pid": "2"}]},
                    {**same, "ok": 1}):
        assert not holds_shape(shape(changed), old), changed


def test_a_record_says_how_its_run_ended_in_one_place() -> None:
    assert RunRecord(state="failed", exit_code=127, error="command not found: x").ended_text() == \
        "failed, exit code 127: command not found: x"
    killed = RunRecord(state="killed", signal=9, signal_name="SIGKILL")
    assert (killed.ended_text(), killed.end_cause()) == ("killed, signal 9 (SIGKILL)", "signal SIGKILL")
    assert RunRecord(state="lost", error="supervisor gone").end_cause() == "supervisor gone"
    assert RunRecord().ended_text() == "ended"
