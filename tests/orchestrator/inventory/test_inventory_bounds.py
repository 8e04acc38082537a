"""An inventory cannot exhaust memory: a YAML alias bomb ("billion laughs": 1 KB naming 10^9 values, which drove
`ps` to 23 GB) and a file over 1 MiB are refused with one line naming the file (exit 2). The bomb runs under an
address-space limit: before the bound it ran out of memory instead."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.lab.workloads import run_cli
from tests.trainer.test_config_bounds import LIMITED, MEMORY_LIMIT_MIB, alias_bomb

ROOT = Path(__file__).resolve().parents[3]


def test_an_alias_bomb_inventory_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  local: {transport: local}\n" + alias_bomb("x-bomb"))
    assert len(inventory.read_bytes()) < 1024
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", LIMITED, str(MEMORY_LIMIT_MIB), "orchestrator", "--inventory",
                           str(inventory), "ps"], capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dflashctl: error: {inventory}: "), done.stderr[-2000:]
    assert "aliases" in lines[0]


def test_a_recursive_alias_is_counted_once_not_forever(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  local: {transport: local}\nx-loop: &loop [*loop]\n")
    code, _, err = run_cli(str(inventory), "ps", "--json", capsys=capsys)
    assert code == 2 and f"{inventory}:" in err and "Traceback" not in err, err


def test_an_inventory_over_1_mib_is_refused_naming_the_file(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  local:\n    transport: local\n    workdir: {tmp_path / 'work'}\n"
                         + "# padding\n" * 120_000)
    code, out, err = run_cli(str(inventory), "ps", capsys=capsys)
    assert code == 2 and out == "", out
    assert err.strip() == (f"dflashctl: error: {inventory}: the inventory is larger than the limit of 1 MiB "
                           f"(1048576 bytes)"), err
