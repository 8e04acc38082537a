"""`dflashctl demo --no-watch`: a tiny target, its own data, a real short CPU training run on `local`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.cli import main as run_cli
from tests.lab.workloads import stop_keeper

pytest.importorskip("torch")


@pytest.mark.slow
def test_demo_trains_on_local_and_summarises(tmp_path: Path, capsys, monkeypatch) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local:\n    transport: local\n    workdir: {json.dumps(str(tmp_path / 'work'))}\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        demo_and_watch(inventory, capsys)
    finally:
        stop_keeper(tmp_path / "work" / ".dflash" / "runs")


def test_the_demo_shows_a_trainer_command_s_progress_as_it_comes(tmp_path: Path, capsys) -> None:
    """The tiny target answers the demo's prompts for most of a minute: its progress lines are passed on."""
    from orchestrator.cli.demo import _trainer

    _trainer("tiny-target", str(tmp_path / "target"), shown="Wrote a tiny")
    assert f"Wrote a tiny random qwen3 target to {tmp_path / 'target'}" in capsys.readouterr().err


def demo_and_watch(inventory: Path, capsys) -> None:
    code = run_cli(["--inventory", str(inventory), "demo", "--no-watch", "--steps", "20"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert "generate answered=48/48" in captured.err  # the prompts' progress, not a minute of silence
    run_id, state = out.splitlines()[0].split(": ")
    assert state == "succeeded, exit code 0" and run_id.startswith("demo-")
    assert "steps 1..20" in out  # step 1 is logged at once, then every log_every (5) steps
    first_loss, last_loss = map(float, re.search(r"loss (\S+) -> (\S+),", out).groups())
    assert last_loss < first_loss  # it trained
    code = run_cli(["--inventory", str(inventory), "watch", "--once", "--json"])
    snapshot = json.loads(capsys.readouterr().out)
    assert code == 0
    run = next(r for r in snapshot["runs"] if r["run_id"] == run_id)
    assert (run["state"], run["last_step"], run["phase"]) == ("succeeded", 20, "finished")
    host = snapshot["hosts"][0]
    assert len(snapshot["hosts"]) == 1 and {k: host[k] for k in ("name", "connected", "error", "retry_in_s",
                                                                  "reconnecting")} == {
        "name": "local", "connected": True, "error": None, "retry_in_s": None, "reconnecting": False}
    # the workdir's filesystem, as the watch agent measured it
    assert 0 < host["free_bytes"] <= host["total_bytes"] and host["low_disk"] is (
        host["free_bytes"] < 2 * 1024 ** 3 or host["free_bytes"] < 0.05 * host["total_bytes"])
    # the run directory has the trainer's metrics.jsonl too (DESIGN.md's layout), one record per step line
    metrics = Path(run["log_path"]).parent / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if '"step"' in line]
    assert [r["step"] for r in steps if r.get("event") == "step"][-1] == 20
