"""The trainer package on a target, over the lab's real sshd + pct: one directory per trainer version, however
often it is launched, and an upload cut mid-way (the controller killed, the link gone) leaves nothing behind
once the next deploy ran: no temp dir, no receiver still waiting, no zombie under the container's PID 1 (which
never reaps)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.inventory.model import load_inventory
from orchestrator.runs import deploy
from orchestrator.runs.client import RunClient
from orchestrator.transports.pool import Connections
from tests.lab.workloads import fresh_workdir, slow_link
from tests.on_lab import lab_configs
from tests.polling import wait_for

pytestmark = pytest.mark.lab
TARGET = "pve2/300"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deploy")
    return lab_configs.write_config(root / "config.yaml", lab_configs.write_tiny(root), max_steps=2,
                                    checkpoint_every=0)


def dflashctl(inv: Path, *args: str) -> list[str]:
    """A dflashctl process of its own, as each launch of an operator is."""
    return [sys.executable, "-m", "orchestrator", "--inventory", str(inv), *args]


def deploy_trainer(inv: Path) -> None:
    inventory = load_inventory(inv)
    with Connections() as conns:
        RunClient(inventory, conns).deploy(inventory.target(TARGET), with_trainer=True)


def receivers(lab, pkg_root: Path) -> list:
    """Processes in the container that still work on an upload into `pkg_root`."""
    inside = "/workspace/" + str(pkg_root.relative_to(lab.hosts["pve2"].containers[300].workspace))
    return [p for p in lab.ct_processes("pve2", 300) if p.state != "Z" and any(inside in a for a in p.cmdline)]


def upload_steady(lab, pkg_root: Path, steady_s: float = 2.0):
    """A predicate for tests/polling.py: whether a receiver has shown up and stayed for `steady_s`: the upload
    (~15 s over the slow link), not the check of what is there that comes before it (over in milliseconds, and its
    command line names the same dir)."""
    first_seen: dict[int, float] = {}

    def steady() -> bool:
        now = time.monotonic()
        pids = {p.pid for p in receivers(lab, pkg_root)}
        for pid in set(first_seen) - pids:
            del first_seen[pid]
        return any(now - first_seen.setdefault(pid, now) >= steady_s for pid in pids)

    return steady


def test_four_launches_of_one_trainer_leave_one_package_directory(lab, config, tmp_path) -> None:
    inv = tmp_path / "inventory.yaml"
    pkg_root = fresh_workdir(lab, inv, "pkg") / ".dflash" / "pkg"
    for i in range(4):  # each a process of its own, seconds apart: each builds the archive anew
        done = subprocess.run(dflashctl(inv, "launch", TARGET, "--config", str(config), "--gpus", "none", "--name",
                                        f"pkg{i}"), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(pkg_root)) == [deploy.trainer_bundle().digest]
    # where the agent and the trainer are, a trainer launch is the preflight's probe and the launch itself: the
    # trainer's check and lease ride in the launch's one `pct exec`
    log = lab.hosts["pve2"].containers[300].dir / "exec.log"
    before = len(log.read_text().splitlines())
    done = subprocess.run(dflashctl(inv, "launch", TARGET, "--config", str(config), "--gpus", "none", "--name",
                                    "pkg4"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    assert len(calls) == 2 and all(call[0] == "sh" for call in calls), calls


@pytest.fixture()
def cut_upload(lab, tmp_path):
    """A fresh workdir with the agent already there, so that the trainer is what crosses the slow link; yields
    (inventory, pkg root) and checks, after the test cut the upload, what the next deploy leaves."""
    inv = tmp_path / "inventory.yaml"
    pkg_root = fresh_workdir(lab, inv, "cutpkg") / ".dflash" / "pkg"
    assert subprocess.run(dflashctl(inv, "ps", TARGET), capture_output=True, timeout=120).returncode == 0
    before = lab.zombies("pve2", 300)
    yield inv, pkg_root
    assert wait_for(lambda: not receivers(lab, pkg_root), 30), receivers(lab, pkg_root)  # nobody still waits
    deploy_trainer(inv)
    assert sorted(os.listdir(pkg_root)) == [deploy.trainer_bundle().digest]  # no temp dir beside it
    assert lab.lasting_zombies("pve2", 300, besides=before) == set()


def test_an_upload_cut_by_killing_the_controller_leaves_nothing_behind(lab, config, cut_upload) -> None:
    inv, pkg_root = cut_upload
    with slow_link(lab, "pve2"):
        controller = subprocess.Popen(dflashctl(inv, "launch", TARGET, "--config", str(config), "--gpus", "none"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_for(upload_steady(lab, pkg_root), 60)
        finally:
            controller.kill()  # SIGKILL mid-upload: no chance to clean anything up
            controller.wait()


def test_an_upload_cut_by_the_link_going_down_leaves_nothing_behind(lab, cut_upload, monkeypatch) -> None:
    # the receiver gives up on a silent sender after a stall; 2 s here, so the test need not wait a minute
    monkeypatch.setattr(deploy, "UPLOAD_STALL_S", 2.0)
    inv, pkg_root = cut_upload
    failed: list[DflashError] = []

    def controller() -> None:
        try:
            deploy_trainer(inv)
        except DflashError as exc:
            failed.append(exc)

    with slow_link(lab, "pve2"):
        thread = threading.Thread(target=controller, daemon=True)
        thread.start()
        assert wait_for(upload_steady(lab, pkg_root), 60)
        lab.link_down("pve2")
        try:
            gone = wait_for(lambda: not receivers(lab, pkg_root), 30)
        finally:
            lab.link_up("pve2")
    thread.join(120)
    assert gone and not thread.is_alive() and failed  # the receiver gave up, and the controller says it failed
