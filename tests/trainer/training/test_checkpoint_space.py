"""Checkpoint saves that cannot hurt the last good one, on a real full disk (a small tmpfs mounted per test):
room checked before a save, a disk that fills during one named as such with the partial save removed, retention
that deletes only after the new save is complete, and the manifest `dflashctl pull` verifies against."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import run_trainer, write_config
from tests.trainer.model.test_serving import target, trained_like  # noqa: F401  (fixture)
from tests.trainer.tiny_models import tiny_target_dir  # noqa: F401  (fixture)
from trainer.training.checkpoints import MANIFEST_FILE, complete_checkpoints, save_checkpoint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def mount_tmpfs(path: Path, size: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    return path


@pytest.fixture()
def small_disk(tmp_path):
    """mount(size) -> a tmpfs of that many bytes, unmounted after the test."""
    mounted = []

    def mount(size: int, name: str = "disk") -> Path:
        mounted.append(mount_tmpfs(tmp_path / name, size))
        return mounted[-1]

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def state_with(size_mb: int, **extra) -> dict:
    """A training state whose optimizer holds `size_mb` MB of moments."""
    return {"step": 1, "optimizer": {"exp_avg": torch.ones(size_mb * 2**18)}, "config": {"keep": 1}, **extra}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def intact(step_dir: Path) -> bool:
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())["files"]
    return all(sha256(step_dir / name) == entry["sha256"] for name, entry in manifest.items())


def test_a_save_ends_with_a_manifest_of_each_files_size_and_sha256(target, tmp_path):
    path = save_checkpoint(tmp_path, 3, drafter=trained_like(target, seed=1), state=state_with(1), keep=0,
                           save_dtype="bfloat16")
    manifest = json.loads((path / MANIFEST_FILE).read_text())["files"]
    on_disk = {p.name for p in path.iterdir()} - {MANIFEST_FILE}
    assert set(manifest) == on_disk and {"model.safetensors", "training_state.pt"} <= on_disk
    for name, entry in manifest.items():
        assert entry == {"size": (path / name).stat().st_size, "sha256": sha256(path / name)}, name


def test_a_save_the_disk_has_no_room_for_is_refused_before_writing_and_the_last_good_one_stays(
        target, small_disk):
    from trainer.training.checkpoint_space import DiskFull

    disk = small_disk(14 * 2**20)
    drafter = trained_like(target, seed=1)
    first = save_checkpoint(disk, 1, drafter=drafter, state=state_with(8), keep=1, save_dtype="bfloat16")
    with pytest.raises(DiskFull, match=r"not enough space for a checkpoint at .*: \d+ bytes free, save needs ~\d+"):
        save_checkpoint(disk, 2, drafter=drafter, state=state_with(8), keep=1, save_dtype="bfloat16")
    assert [p.name for p in disk.iterdir()] == ["step_1"]  # keep=1 deleted nothing for a save that did not happen
    assert complete_checkpoints(disk) == [(1, first)] and intact(first)


class FillsTheDisk:
    """Pickled inside torch.save: fills the disk at that moment, as another process writing there would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        with open(self.path, "wb") as sink:
            try:
                while True:
                    sink.write(b"\0" * 2**20)
            except OSError:
                pass
        return (str, ("filled",))


def test_a_disk_that_fills_during_the_save_is_named_and_the_partial_save_removed(target, small_disk):
    from trainer.training.checkpoint_space import DiskFull

    disk = small_disk(64 * 2**20)
    drafter = trained_like(target, seed=1)
    first = save_checkpoint(disk, 1, drafter=drafter, state=state_with(4), keep=1, save_dtype="bfloat16")
    filler = disk / "someone-elses-file"
    with pytest.raises(DiskFull, match=r"disk full at .*: \d+ bytes free, save needs ~\d+"):
        save_checkpoint(disk, 2, drafter=drafter, state=state_with(4, other=FillsTheDisk(filler)), keep=1,
                        save_dtype="bfloat16")
    assert sorted(p.name for p in disk.iterdir()) == ["someone-elses-file", "step_1"]  # no partial step dir
    assert complete_checkpoints(disk) == [(1, first)] and intact(first)


def test_retention_keeps_the_save_just_completed_even_when_its_step_is_lower(target, tmp_path):
    drafter = trained_like(target, seed=1)
    for step in (10, 20):
        save_checkpoint(tmp_path, step, drafter=drafter, state=state_with(1), keep=2, save_dtype="float32")
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [10, 20]
    # a run resumed from an older checkpoint saves lower steps: its newest save is the one to keep
    newest = save_checkpoint(tmp_path, 5, drafter=drafter, state=state_with(1), keep=1, save_dtype="float32")
    assert complete_checkpoints(tmp_path) == [(5, newest)]


def test_a_stale_temp_of_a_killed_save_is_removed_before_the_next_save(target, tmp_path):
    stale = tmp_path / ".tmp-step_4-999999999"  # no such pid
    stale.mkdir()
    (stale / "training_state.pt").write_bytes(b"half")
    save_checkpoint(tmp_path, 5, drafter=trained_like(target, seed=1), state=state_with(1), keep=0)
    assert not stale.exists()


@pytest.mark.parametrize("policy, code", [("skip", 0), ("stop", 1)])
def test_a_run_whose_disk_fills_keeps_training_or_stops_as_configured(base_config, small_disk, tmp_path, policy,
                                                                      code):
    disk = small_disk(int(1.6 * checkpoint_size(base_config, tmp_path)))
    config = {**base_config, "output_dir": str(disk / "out"), "max_steps": 6, "checkpoint_every": 2,
              "keep_checkpoints": 1, "on_disk_full": policy}
    result = run_trainer("train", "--config", write_config(tmp_path / "run.yaml", **config))
    assert result.returncode == code, result.stderr[-3000:]
    assert "Checkpoint of step 4 not saved: not enough space for a checkpoint at" in result.stdout
    assert [step for step, _ in complete_checkpoints(disk / "out")] == [2]
    assert intact(disk / "out" / "step_2")
    if policy == "skip":
        assert "Finished: 6 steps" in result.stdout
    else:
        assert "Finished" not in result.stdout and "error: not enough space" in result.stderr


def checkpoint_size(base_config: dict, tmp_path: Path) -> int:
    """The bytes of one checkpoint of the base config's drafter, measured by saving one."""
    out = tmp_path / "measure"
    config = {**base_config, "output_dir": str(out), "max_steps": 1}
    assert run_trainer("train", "--config", write_config(tmp_path / "measure.yaml", **config)).returncode == 0
    return sum(p.stat().st_size for p in (out / "step_1").iterdir())
