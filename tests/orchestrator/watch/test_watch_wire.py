"""The controller reads the watch stream of a deployed agent of the last version (its lines as recorded in
tests/dflash_records/test_watchwire.py) through the stream's one decode into the source: the run, its exact
figures, and the follow command the agent answers with a bounded first look (an old agent ignores the bound)."""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.inventory.model import load_inventory
from orchestrator.watch import stream as stream_module
from orchestrator.watch.source import LiveSource
from tests.dflash_records.test_watchwire import OLD_AGENT_LINES
from tests.lab.workloads import write_local_inventory


class _Proc:
    """The agent's end of a stream: what the controller writes back to it (its follow commands)."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def write(self, data: bytes) -> None:
        self.sent.append(json.loads(data))


def test_a_controller_reads_an_old_agents_stream_to_the_exact_figures_and_asks_for_a_bounded_first_look(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(stream_module.ContainerStream, "start", lambda self: None)  # no agent: the lines below
    inventory = load_inventory(Path(write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")))
    source = LiveSource(inventory, [inventory.target("local")], first_look=20 * 1024)
    stream, proc = source._streams["local"], _Proc()
    stream._dispatch(proc, [line.encode() for line in OLD_AGENT_LINES] + [b"a warning the container printed"])
    assert proc.sent == [{"follow": {"r-1": {"offset": -1, "tail": 20 * 1024}}}]  # an old agent ignores `tail`
    [run] = source.snapshot().runs
    assert (run.run_id, run.state, run.last_step, run.tok_per_s, run.loss) == ("r-1", "running", 7, 350.4, 2.71828)
    assert run.history[-1].tok_per_s == 350.4 and run.log_tail[0] == "Loading dataset from /data..."
    assert source.alert_feed(0).runs["r-1"].last_step.tok_per_s == 350.4  # what notifications quote
