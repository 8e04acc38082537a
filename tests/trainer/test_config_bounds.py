"""A trainer config cannot exhaust memory: a YAML alias bomb ("billion laughs", 1 KB naming 10^9 values) and a
file over 1 MiB are refused with one line naming the file, by the trainer and by the controller that reads the
config before a launch. The bomb runs under an address-space limit: before the bound it ran out of memory."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.lab.workloads import run_cli
from tests.trainer.conftest import REPO_ROOT, trainer_env

MEMORY_LIMIT_MIB = 768
LIMITED = ("import resource, runpy, sys; limit = int(sys.argv[1]) << 20; "
           "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); sys.argv = sys.argv[2:]; "
           "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def alias_bomb(key: str, depth: int = 9) -> str:
    """`key` set to nine levels of nine aliases each: under 1 KB of YAML, 9^9 (~387 million) strings."""
    lines = ["anchors:", '  - &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"  - &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, depth)]
    return "\n".join(lines) + f"\n{key}: *l{depth - 1}\n"


def run_limited(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LIMITED, str(MEMORY_LIMIT_MIB), module, *args],
                          capture_output=True, text=True, timeout=90, env=trainer_env(), cwd=REPO_ROOT)


def test_an_alias_bomb_config_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb("target_path"))  # a field whose error message once printed the whole value
    assert len(config.read_bytes()) < 1024
    done = run_limited("trainer", "check", "--config", str(config))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "aliases" in lines[0], done.stderr[-2000:]


def test_a_config_over_1_mib_is_refused_naming_the_file(tmp_path: Path, capsys) -> None:
    config = tmp_path / "big.yaml"
    config.write_text("target_path: /t\ndata_path: /d\noutput_dir: /o\n" + "# padding\n" * 120_000)
    done = run_limited("trainer", "check", "--config", str(config))
    assert done.returncode == 2 and "1 MiB" in done.stderr and str(config) in done.stderr, done.stderr[-2000:]
    inventory = tmp_path / "inventory.yaml"  # the controller reads it before a launch, through the trainer
    inventory.write_text(f"hosts:\n  local:\n    transport: local\n    workdir: {tmp_path / 'work'}\n")
    code, out, err = run_cli(str(inventory), "launch", "local", "--config", str(config), capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("dflashctl: error: ") and str(config) in err and "1 MiB" in err, err
