"""doctor and a trainer config on the `local` target: `doctor --config` runs the trainer's own check as `launch`
does, a config file that is not UTF-8 is the same one-line usage error (exit 2) in both, and the table shows
what --json has."""
from __future__ import annotations

import json

import pytest

from tests.lab.workloads import run_cli


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


def test_doctor_s_table_has_the_agent_column_its_json_has(inv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # every column whole on one line
    run_cli(inv, "doctor", "local", "--json", capsys=capsys)  # the first doctor deploys the agent it probes with
    code, result, _ = run_cli(inv, "doctor", "local", "--json", capsys=capsys)
    agent = result["targets"]["local"]["agent"]
    assert agent == "ok"
    code, table, _ = run_cli(inv, "doctor", "local", capsys=capsys)
    header = next(line for line in table.splitlines() if "target" in line and "reach" in line)
    assert "agent" in header
    row = next(line for line in table.splitlines() if line.strip("│┃ ").startswith("local"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    assert cells[names.index("agent")] == agent


def test_doctor_takes_a_configs_relative_paths_from_where_the_trainers_check_does(inv, tmp_path, capsys, monkeypatch):
    """On `local` from the config file's directory, whatever the shell's: doctor's own rows (the target's size,
    the paths' filesystems) and the trainer's check in the same table speak of the same files."""
    project = tmp_path / "project"
    (project / "model").mkdir(parents=True)
    (project / "model" / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 256}))
    config = project / "small.yaml"
    config.write_text("target_path: model\ndata_path: data\noutput_dir: out\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, result, err = run_cli(inv, "doctor", "local", "--config", str(config), "--json", capsys=capsys)
    rows = {row["name"]: row for row in result["targets"]["local"]["checks"] if row["name"].startswith("config.")}
    checked = [row["detail"] for row in result["targets"]["local"]["checks"] if row["name"] == "trainer check"]
    assert rows["config.target_path"]["status"] == "ok", rows
    assert rows["config.target_path"]["detail"].startswith(f"{project / 'model'} on "), rows
    assert "size not estimated" not in rows["config.checkpoints"]["detail"], rows  # its config.json was read
    assert rows["config.data_path"]["detail"] == f"{project / 'data'} does not exist on local", rows
    assert any(str(project / "data") in detail for detail in checked), checked  # the same path, both ways
