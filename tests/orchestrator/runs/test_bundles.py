"""What is shipped to targets is the same bytes, so the same digest, whenever and wherever it is built: a new
digest means a new package directory on every target (and a new upload), so only the code may change it."""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from pathlib import Path

import trainer
from orchestrator.runs import deploy
from orchestrator.runs.bundle import build_tarball, build_zipapp

TRAINER = Path(trainer.__file__).resolve().parent


def test_two_builds_a_day_apart_are_the_same_bytes(monkeypatch):
    # gzip writes the time into its header: with tarfile's "w:gz" two builds a second apart differed
    first_trainer, first_agent = deploy.trainer_bundle(), build_zipapp()
    later = time.time() + 86400
    monkeypatch.setattr(time, "time", lambda: later)
    deploy.trainer_bundle.cache_clear()
    try:
        second = deploy.trainer_bundle()
    finally:
        deploy.trainer_bundle.cache_clear()
    assert (second.digest, second.data) == (first_trainer.digest, first_trainer.data)
    assert build_zipapp() == first_agent


def test_a_checkout_with_other_modes_mtimes_and_compiled_files_packs_the_same(tmp_path):
    tar, data = build_tarball({"trainer": TRAINER})
    copy = tmp_path / "trainer"
    shutil.copytree(TRAINER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        os.chmod(path, 0o775)  # a umask of 002, an executable script
        os.utime(path, (1e9, 1e9))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "config.cpython-311.pyc").write_bytes(b"\x00compiled")
    (copy / "config.py.orig").write_text("an editor's leftover")
    assert build_tarball({"trainer": copy}) == (tar, data)
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and "trainer/config.py" in names and "trainer/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.startswith("trainer/")]
    assert {(m.type, m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == \
        {(tarfile.REGTYPE, 0o644, 0, 0, "", "", 0)}


def test_the_trainer_bundle_carries_the_records_it_writes():
    # the trainer imports dflash_records (its step line and metrics.jsonl record): unpacked alone on a target's
    # PYTHONPATH it must find them beside it
    names = tarfile.open(fileobj=io.BytesIO(deploy.trainer_bundle().data)).getnames()
    assert "trainer/training/metrics.py" in names and "dflash_records/step.py" in names
    assert {name.split("/")[0] for name in names} == {"trainer", "dflash_records"}
