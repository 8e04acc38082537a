"""A trainer launch on `local` is checked by the trainer first: a refused config starts and creates nothing."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.lab.workloads import run_cli as cli


def _inventory(tmp_path: Path, *, python: str = sys.executable) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"local": {"transport": "local", "workdir": str(tmp_path / "wd"),
                                                        "python": python}}}))
    return str(path)


def _config(tmp_path: Path, **values) -> Path:
    path = tmp_path / "C.yaml"
    path.write_text(yaml.safe_dump({"target_path": str(tmp_path), "data_path": str(tmp_path / "no-data"),
                                    "output_dir": str(tmp_path / "out"), **values}))
    return path


def test_a_missing_data_path_fails_a_local_launch_with_exit_2_and_creates_no_run(tmp_path, capsys):
    code, out, err = cli(_inventory(tmp_path), "launch", "local", "--config", str(_config(tmp_path)),
                         capsys=capsys)
    assert code == 2 and out == ""
    assert f"local: {tmp_path / 'C.yaml'}: 2 problems, nothing was started:" in err
    assert f"data_path: dataset directory {tmp_path / 'no-data'} does not exist" in err
    assert f"target_path: {tmp_path} is not a Hugging Face model directory (no config.json)" in err
    assert "Traceback" not in err
    assert not (tmp_path / "wd" / ".dflash" / "runs").exists()


def test_a_file_that_is_not_a_yaml_mapping_is_refused_before_anything_is_deployed(tmp_path, capsys):
    config = tmp_path / "list.yaml"
    config.write_text("- just\n- a list\n")
    code, _, err = cli(_inventory(tmp_path), "launch", "local", "--config", str(config), capsys=capsys)
    assert code == 2 and "expected a mapping of config keys, got list" in err
    assert not (tmp_path / "wd").exists()


def test_a_check_that_cannot_run_there_fails_the_launch_with_its_reason(tmp_path, capsys):
    python = tmp_path / "python-without-pydantic"
    python.write_text("#!/bin/sh\n"   # runs the agent, but not the trainer
                      "if [ \"$1 $2\" = \"-m trainer\" ]; then\n"
                      "  echo \"ModuleNotFoundError: No module named 'pydantic'\" >&2; exit 1\n"
                      f"fi\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    code, _, err = cli(_inventory(tmp_path, python=str(python)), "launch", "local", "--config",
                       str(_config(tmp_path)), capsys=capsys)
    assert code == 1
    assert "the trainer's config check could not run there, nothing was started" in err
    assert "No module named 'pydantic'" in err
    assert not (tmp_path / "wd" / ".dflash" / "runs").exists()
