"""A trainer launch is checked by the trainer itself on the target first (over the lab's real sshd + pct), and
every run gets its compile caches under the target's workdir."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lab.workloads import run_cli as cli
from tests.on_lab import lab_configs

pytestmark = pytest.mark.lab
CT = ("pve1", 200)
TARGET = "pve1/200"
CACHE = {"TORCHINDUCTOR_CACHE_DIR": "/workspace/.dflash/cache/inductor",
         "TRITON_CACHE_DIR": "/workspace/.dflash/cache/triton"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return lab_configs.write_tiny(tmp_path_factory.mktemp("launch-check"))


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    return str(lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml"))


def write_config(path: Path, tiny: dict[str, Path], **overrides) -> Path:
    """A run that keeps going (it is killed or refused), with no checkpoints."""
    return lab_configs.write_config(path, tiny, **{"max_steps": 1000, "checkpoint_every": 0, **overrides})


def run_ids(lab) -> set[str]:
    runs = lab.hosts[CT[0]].containers[CT[1]].workspace / ".dflash" / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")} if runs.is_dir() else set()


def live_runs(inv: str, capsys) -> list[dict]:
    code, payload, err = cli(inv, "ps", TARGET, "--all", "--json", capsys=capsys)
    assert code == 0, err
    return [r for r in payload["runs"] if r["state"] in ("starting", "running")]


def test_a_config_with_a_missing_data_path_fails_the_launch_and_leaves_nothing(lab, inv, capsys, tiny,
                                                                              tmp_path) -> None:
    before = run_ids(lab)
    config = write_config(tmp_path / "C.yaml", tiny, data_path="/workspace/no-such-data", learning_rate=1e-3,
                          drafter_layers=5)
    code, out, err = cli(inv, "launch", TARGET, "--config", str(config), capsys=capsys)
    assert code == 2, err
    assert f"{TARGET}: {config}: 3 problems, nothing was started" in err
    lines = [line.strip() for line in err.splitlines()]
    # the trainer's own words, in its order: keys, then paths, then what is read from the paths
    assert lines.index("unknown key 'learning_rate' (did you mean 'lr'?)") < lines.index(
        "data_path: dataset directory /workspace/no-such-data does not exist; make it with "
        "`python -m trainer prepare`")
    assert any(line.startswith("drafter_layers: a 6-layer target has too few layers for 5 taps") for line in lines)
    assert "Traceback" not in err and out == ""
    assert run_ids(lab) == before and live_runs(inv, capsys) == []


def test_relative_paths_are_checked_from_the_container_s_workdir(lab, inv, capsys, tiny, tmp_path) -> None:
    # the config's directory on this machine means nothing in the container: its workdir places them
    config = write_config(tmp_path / "rel.yaml", tiny, target_path="target-in-the-workdir")
    code, _, err = cli(inv, "launch", TARGET, "--config", str(config), capsys=capsys)
    assert code == 2, err
    assert ("target_path: target directory 'target-in-the-workdir' (= /workspace/target-in-the-workdir) does not "
            "exist (nothing was started)") in err


def test_a_valid_config_launches_with_the_compile_caches_under_the_workdir(lab, inv, capsys, tiny,
                                                                          tmp_path) -> None:
    config = write_config(tmp_path / "ok.yaml", tiny)
    code, record, err = cli(inv, "launch", TARGET, "--config", str(config), "--json",
                            "--env", "TRITON_CACHE_DIR=/workspace/mine", capsys=capsys)
    assert code == 0, err
    try:
        assert record["state"] == "running"
        run_json = json.loads(lab.ct_run(*CT, ["cat", f"/workspace/.dflash/runs/{record['run_id']}/run.json"]).stdout)
        assert run_json["env"]["TORCHINDUCTOR_CACHE_DIR"] == CACHE["TORCHINDUCTOR_CACHE_DIR"]
        assert run_json["env"]["TRITON_CACHE_DIR"] == "/workspace/mine"   # the user's --env wins
        trainer = [p for p in lab.ct_processes(*CT) if p.environ.get("DFLASH_RUN_ID") == record["run_id"]]
        assert trainer and trainer[0].environ["TORCHINDUCTOR_CACHE_DIR"] == CACHE["TORCHINDUCTOR_CACHE_DIR"]
    finally:
        code, result, _ = cli(inv, "kill", record["run_id"], "--grace", "2", "--json", capsys=capsys)
    assert code == 0 and result["targets"][TARGET]["ok"]


def test_any_command_gets_the_compile_caches_too(lab, inv, capsys) -> None:
    code, record, err = cli(inv, "launch", TARGET, "--json", "--", "sh", "-c",
                            "echo $TORCHINDUCTOR_CACHE_DIR $TRITON_CACHE_DIR", capsys=capsys)
    assert code == 0, err
    code, out, _ = cli(inv, "logs", record["run_id"], capsys=capsys)
    assert out.strip().splitlines()[-1] == f"{CACHE['TORCHINDUCTOR_CACHE_DIR']} {CACHE['TRITON_CACHE_DIR']}"


def test_doctor_shows_the_cache_size(lab, inv, capsys) -> None:
    # pve2/300's cache may hold what an earlier test of this lab session compiled there: only ours may grow
    other_before = cli(inv, "doctor", "pve2/300", "--json", capsys=capsys)[1]["targets"]["pve2/300"]["cache_bytes"]
    lab.ct_run(*CT, ["sh", "-c", "mkdir -p /workspace/.dflash/cache/triton && head -c 300000 /dev/zero "
                                 "> /workspace/.dflash/cache/triton/blob"])
    code, report, err = cli(inv, "doctor", TARGET, "pve2/300", "--json", capsys=capsys)
    assert code == 0, err
    ours, other = report["targets"][TARGET], report["targets"]["pve2/300"]
    assert ours["cache_dir"] == "/workspace/.dflash/cache" and 300000 <= ours["cache_bytes"] < 400000
    assert other["cache_bytes"] == other_before
    code, table, _ = cli(inv, "doctor", TARGET, capsys=capsys)
    assert code == 0 and "cache" in table and "KiB" in table


def test_a_job_is_checked_on_every_node_before_any_node_starts(lab, inv, capsys, tiny, tmp_path) -> None:
    """The data is where the config says on pve1/200 only: pve2/300 refuses, so pve1/200 starts nothing."""
    import shutil

    shutil.copytree(tiny["dataset"], lab.hosts["pve1"].containers[200].workspace / "check-data", dirs_exist_ok=True)
    before = {target: cli(inv, "ps", target, "--all", "--json", capsys=capsys)[1]["runs"]
              for target in ("pve1/200", "pve2/300")}
    config = write_config(tmp_path / "job.yaml", tiny, data_path="/workspace/check-data")
    code, _, err = cli(inv, "launch", "pve1/200", "pve2/300", "--config", str(config), capsys=capsys)
    assert code == 2, err
    assert (f"pve2/300: {config}: data_path: dataset directory /workspace/check-data does not exist" in err
            and "pve1/200:" not in err)
    for target, runs in before.items():
        assert cli(inv, "ps", target, "--all", "--json", capsys=capsys)[1]["runs"] == runs
