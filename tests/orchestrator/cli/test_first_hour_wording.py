"""What a newcomer reads in the first hour, each said once and plainly: a config that cannot be read, a failed
deploy, the URL of `watch --serve` on every address, the demo's config against the one docs/trainer.md shows, the
configs `launch --help` names. (cleanup of an unreachable host: test_cli_refusals.py)"""
from __future__ import annotations

import re
import socket
from pathlib import Path

import yaml

from tests.lab.workloads import run_cli, stop_keeper

REPO = Path(__file__).resolve().parents[3]
TRAINER_MD = REPO / "docs" / "trainer.md"


def test_a_config_that_cannot_be_read_is_named_once(tmp_path, capsys):
    from trainer.__main__ import main as trainer_main

    missing = tmp_path / "nosuch.yaml"
    assert trainer_main(["check", "--config", str(missing)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"error: {missing}: cannot read the config: No such file or directory", line
    assert line.count("nosuch.yaml") == 1


def test_a_failed_deploy_says_what_failed_not_the_script_it_ran(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local:\n    transport: local\n    workdir: {tmp_path / 'afile' / 'work'}\n")
    try:
        code, _, err = run_cli(str(inventory), "launch", "local", "--", "true", capsys=capsys)
    finally:
        stop_keeper(tmp_path / "afile" / "work" / ".dflash" / "runs")
    line = err.strip().splitlines()[-1]
    assert code != 0 and line.startswith("dflashctl: error: local: cannot write "), err
    assert "Not a directory" in line and "sh -c" not in line and "$" not in line, line


def test_serving_on_every_address_gives_a_url_other_machines_can_open():
    from orchestrator.cli.watchserve import LOOPBACK_NAMES, bind_note, page_url

    for wildcard in ("0.0.0.0", "::"):
        host = re.match(r"http://\[?([^]/:]+)\]?:8000/\?token=t$", page_url(wildcard, 8000, "t")).group(1)
        if socket.gethostname().split(".")[0].lower() not in LOOPBACK_NAMES:  # this machine has a name of its own
            assert host.split(".")[0].lower() not in LOOPBACK_NAMES, host
        assert wildcard in bind_note(wildcard) and "every address" in bind_note(wildcard)
    assert page_url("127.0.0.1", 80, None) == "http://127.0.0.1:80/" and bind_note("127.0.0.1") == ""


def test_the_small_cpu_run_in_the_docs_is_the_config_the_demo_writes(tmp_path):
    from orchestrator.cli.demo import write_demo_config

    section = TRAINER_MD.read_text(encoding="utf-8").split("### A small CPU run", 1)[1]
    shown = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    written = write_demo_config(tmp_path, tmp_path / "target", tmp_path / "dataset", steps=160).read_text()
    stamp = re.compile(r"^output_dir: out-\d{8}-\d{6}$", re.MULTILINE)
    assert stamp.search(shown) and stamp.search(written), (shown, written)
    assert stamp.sub("output_dir: out-TIME", shown) == stamp.sub("output_dir: out-TIME", written)
    config = yaml.safe_load(written)
    assert (tmp_path / config["target_path"]) == tmp_path / "target"  # relative to the file, as launch reads them


def test_every_config_launch_help_names_is_one_the_docs_show_how_to_make():
    from orchestrator.cli.launch import launch

    named = re.findall(r"--config (\S+\.yaml)", launch.__doc__)
    assert named, launch.__doc__
    docs = TRAINER_MD.read_text(encoding="utf-8") + (REPO / "README.md").read_text(encoding="utf-8")
    for path in named:
        assert Path(path).name in docs, f"launch --help names {path}, which no doc shows how to make"
