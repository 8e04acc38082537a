"""`dflashctl sweep` on `local`: every mistake is one line and exit 2 before anything is deployed or started; a
config of the grid that the trainer's own check refuses on the target stops the whole sweep, naming its values."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.lab.workloads import run_cli as cli


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
