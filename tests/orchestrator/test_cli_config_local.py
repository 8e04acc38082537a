"""A trainer config on the `local` target: `doctor --config` runs the trainer's own check as `launch` does, and
a config file that is not UTF-8 is the same one-line usage error (exit 2) in both."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.lab.workloads import run_cli, stop_keeper


@pytest.fixture
def inv(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  local:\n    transport: local\n"
                    f"    workdir: {json.dumps(str(tmp_path / 'work'))}\n    python: {json.dumps(sys.executable)}\n")
    yield str(path)
    stop_keeper(tmp_path / "work" / ".dflash" / "runs")


def test_doctor_fails_a_config_the_trainer_refuses(inv, tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text(f"target_path: {tmp_path}\ndata_path: {tmp_path}\noutput_dir: out\nlrr: 0.001\n")
    code, result, err = run_cli(inv, "doctor", "local", "--config", str(config), "--json", capsys=capsys)
    assert code == 1, err
    rows = [row for row in result["targets"]["local"]["checks"] if row["name"] == "trainer check"]
    assert any(row["status"] == "fail" and "unknown key 'lrr' (did you mean 'lr'?)" in row["detail"]
               for row in rows), rows
    code, table, _ = run_cli(inv, "doctor", "local", "--config", str(config), capsys=capsys)
    assert code == 1 and "unknown key 'lrr'" in table


@pytest.mark.parametrize("command", [("doctor", "local"), ("launch", "local", "--gpus", "none")])
def test_a_config_that_is_not_utf8_is_a_usage_error(inv, tmp_path, capsys, command):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"\xff\xfet\x00a\x00r\x00")  # UTF-16, as some editors save
    code, out, err = run_cli(inv, *command, "--config", str(config), capsys=capsys)
    assert code == 2 and "Traceback" not in err
    assert f"{config}: not UTF-8 text (byte 0xff at offset 0)" in err
    assert "expected a mapping" not in err
