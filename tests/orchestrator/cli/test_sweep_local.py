"""`dflashctl sweep` on `local`: every mistake is one line and exit 2 before anything is deployed or started; a
config of the grid that the trainer's own check refuses on the target stops the whole sweep, naming its values."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.lab.workloads import run_cli as cli
from tests.polling import wait_for


def _inventory(tmp_path: Path) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"local": {"transport": "local", "workdir": str(tmp_path / "wd"),
                                                        "python": sys.executable}}}))
    return str(path)


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"target_path": str(tmp_path), "data_path": str(tmp_path / "no-data"),
                                    "output_dir": str(tmp_path / "out")}))
    return path


@pytest.mark.parametrize("args, said", [
    (["--set", "lr="], "bad --set 'lr=': give lr one or more values"),
    (["--set", "lr"], "bad --set 'lr': use KEY=V1,V2"),
    (["--set", "objective=ce,ce+dpace"], "unknown config key 'objective' (did you mean 'loss'?)"),
    (["--set", "seed=" + ",".join(map(str, range(17))), "--set", "max_steps=" + ",".join(map(str, range(1, 17)))],
     "the grid has 272 runs (17 x 16), more than 256: nothing was started; --yes starts them all"),
    (["--set", "lr=3e-4,-1"], "base.yaml with lr=-1: lr: Input should be greater than 0"),
    (["--set", "lr=1e-4", "--hosts", "pve*"], "--hosts chooses among the fleet for --anywhere"),
    (["--set", "lr=1e-4", "--anywhere", "--gpu-count", "1", "--hosts", "pve*"], "--hosts: no target matches 'pve*'"),
])
def test_a_mistake_is_one_line_and_exit_2_before_anything_is_deployed(tmp_path, capsys, args, said):
    where = [] if "--anywhere" in args else ["local"]
    code, out, err = cli(_inventory(tmp_path), "sweep", str(_config(tmp_path)), *args, *where, capsys=capsys)
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflashctl: error: ") and said in lines[0], err
    assert not (tmp_path / "wd").exists()  # nothing deployed, nothing queued


def test_a_config_the_trainers_check_refuses_on_the_target_starts_no_run_of_the_sweep(tmp_path, capsys):
    code, out, err = cli(_inventory(tmp_path), "sweep", str(_config(tmp_path)), "--set", "lr=1e-4,3e-4", "local",
                         capsys=capsys)
    assert code == 2 and out == ""
    error = [line for line in err.splitlines() if line.startswith("dflashctl: error: ")]
    assert len(error) == 1 and f"local: {tmp_path / 'base.yaml'} with lr=0.0001: " in error[0]
    assert f"dataset directory {tmp_path / 'no-data'} does not exist" in err and "nothing was started" in err
    assert not (tmp_path / "wd" / ".dflash" / "runs").exists()


def test_a_report_of_a_sweep_with_no_runs_says_so(tmp_path, capsys):
    code, out, err = cli(_inventory(tmp_path), "sweep", "report", "sweep-none-000000", capsys=capsys)
    assert code == 2 and "no runs of sweep 'sweep-none-000000' on local" in err


def _passing_config(tmp_path: Path) -> Path:
    """A config the trainer's check passes (a target's config.json and weights file, a saved dataset's files),
    made without torch: the check reads them as JSON and looks for the files."""
    target, data = tmp_path / "target", tmp_path / "data"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "num_hidden_layers": 6, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256}))
    (target / "model.safetensors").write_bytes(b"")
    data.mkdir()
    (data / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    (data / "dataset_info.json").write_text(json.dumps({"features": {"input_ids": {}, "loss_mask": {}}}))
    (data / "data.arrow").write_bytes(b"")
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"target_path": str(target), "data_path": str(data),
                                    "output_dir": str(tmp_path / "out"), "drafter_layers": 1, "device": "cpu"}))
    return path


def test_a_queued_sweep_run_whose_config_no_longer_passes_at_its_turn_ends_failed_with_why(inv, tmp_path, capsys):
    """The sweep's runs wait behind a run that holds the target's GPUs (no --gpus: all of them); the dataset goes
    away meanwhile; when the holder ends, each run's turn runs the trainer's check again, and it fails."""
    gate = tmp_path / "gate"
    code, _, err = cli(inv, "launch", "local", "--name", "holder", "--", "sh", "-c",
                       f"while [ ! -e {gate} ]; do sleep 0.05; done", capsys=capsys)
    assert code == 0, err
    code, started, err = cli(inv, "sweep", str(_passing_config(tmp_path)), "--set", "seed=0,1", "local", "--json",
                             capsys=capsys)
    assert code == 0, err
    assert [r["state"] for r in started["runs"]] == ["queued", "queued"], started
    (tmp_path / "data" / "state.json").unlink()
    gate.touch()  # the holder ends by itself

    seen: list = []

    def ended() -> list[dict] | None:
        _, listed, _ = cli(inv, "ps", "--sweep", started["sweep_id"], "--json", capsys=capsys)
        seen[:] = listed["runs"]
        return seen if seen and all(r["state"] not in ("queued", "starting", "running") for r in seen) else None

    runs = wait_for(ended, 60, 0.2, what=lambda: f"the sweep's runs to take their turns: {seen}")
    assert [r["state"] for r in runs] == ["failed", "failed"], runs
    for run in runs:
        assert run["error"].startswith("its check failed when its turn came (exit 2)"), run
        assert f"dataset {tmp_path / 'data'} is not a saved Arrow dataset" in run["error"], run
