"""doctor on GPU containers of the lab, each planted with the failures that cost the seed run days: one doctor
run checks many rows. CT 210 is healthy; CT 211 has a container driver older than the host's kernel module,
a GPU node its CT config does not bind and an nvidia-uvm its device rules do not allow; CT 212 has a 16 MiB
/dev/shm, a nearly full disk on /workspace, GPU memory held with no run, one core for two GPUs, the model on
tmpfs and an nvidia-uvm that the host had not created when the container started."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.lab import ContainerSpec, ct_config
from tests.lab.workloads import run_cli as cli
from tests.on_lab import lab_configs

pytestmark = pytest.mark.lab
HOST = "pve1"
HEALTHY, DRIVER_DEVICES, STORAGE = 210, 211, 212
OLD_DRIVER = "575.57.08"


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch) -> None:
    """Whole cells on one line: the tables are read as text, and a COLUMNS left by the environment (the CLI honours
    it when stdout is not a terminal) would wrap a cell's text across lines."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return lab_configs.write_tiny(tmp_path_factory.mktemp("doctor-tiny"))


@pytest.fixture(scope="module")
def planted(lab, tmp_path_factory, tiny):
    """The three containers on pve1 and an inventory that has them; removed afterwards."""
    uvm = lab.hosts[HOST].dir / "dev" / "nvidia-uvm"
    specs = [
        ContainerSpec(HEALTHY, gpus=1),
        ContainerSpec(DRIVER_DEVICES, gpus=2, nvml=OLD_DRIVER,
                      config=ct_config(DRIVER_DEVICES, 2, drop=("dev/nvidia1 ", "c 508:"))),
        ContainerSpec(STORAGE, gpus=[{"memory.used": 40000, "utilization.gpu": 0}, {}],
                      config=ct_config(STORAGE, 2, extra=(
                          "cores: 1", "mp0: local:212/vm-212-disk-1.raw,mp=/workspace,size=128M",
                          "lxc.mount.entry: tmpfs dev/shm tmpfs size=16M,nosuid,nodev,create=dir 0 0"))),
    ]
    moved = uvm.with_name(".nvidia-uvm")
    try:
        for spec in specs:
            if spec.ctid == STORAGE:  # as on a host where nothing had used CUDA yet when the CT started
                uvm.rename(moved)
            try:
                lab.add_container(HOST, spec)
            finally:
                if moved.exists():
                    moved.rename(uvm)
        fill = lab.ct_run(HOST, STORAGE, ["sh", "-c", "head -c 100M /dev/zero > /workspace/fill && "
                                                      f"cp -a {tiny['target']} /dev/shm/model"])
        assert fill.returncode == 0, fill.stderr
        lab.ct_run(HOST, HEALTHY, ["cp", "-a", str(tiny["target"]), "/dev/shm/model"], timeout=30)
        yield str(lab.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml"))
    finally:
        for spec in specs:
            if spec.ctid in lab.hosts[HOST].containers:
                lab.remove_container(HOST, spec.ctid)


def rows(report: dict) -> dict[str, dict]:
    return {row["name"]: row for row in report["checks"]}


def test_doctor_gives_each_planted_failure_its_row_and_fix(lab, planted, capsys) -> None:
    code, payload, err = cli(planted, "doctor", *(f"{HOST}/{ct}" for ct in (HEALTHY, DRIVER_DEVICES, STORAGE)),
                             "--json", capsys=capsys)
    assert code == 1, err
    reports = payload["targets"]
    healthy = rows(reports[f"{HOST}/{HEALTHY}"])
    assert set(healthy) == {"reach", "compile_cache", "nvidia_smi", "driver", "device_nodes", "ct_config", "gpus_held", "shm",
                            "workdir", "limits"}
    assert {name: row["status"] for name, row in healthy.items() if row["status"] != "ok"} == {}
    assert reports[f"{HOST}/{HEALTHY}"]["ok"] and reports[f"{HOST}/{HEALTHY}"]["error"] is None

    sick = rows(reports[f"{HOST}/{DRIVER_DEVICES}"])
    assert sick["driver"]["status"] == "fail"
    assert f"host kernel module 580.159.04 but libnvidia-ml {OLD_DRIVER}" in sick["driver"]["detail"]
    assert "NVIDIA-Linux-x86_64-580.159.04.run --no-kernel-module" in sick["driver"]["fix"]
    assert "Driver/library version mismatch" in sick["nvidia_smi"]["detail"]  # the fake fails as the real one
    assert sick["device_nodes"]["status"] == "fail"
    assert "/dev/nvidia-uvm does not open: Permission denied" in sick["device_nodes"]["detail"]
    assert "/dev/nvidia1 is missing" in sick["device_nodes"]["detail"]
    assert sick["ct_config"]["status"] == "fail"
    assert "no lxc.cgroup2.devices.allow for nvidia-uvm (major 508)" in sick["ct_config"]["detail"]
    assert "no lxc.mount.entry for /dev/nvidia1" in sick["ct_config"]["detail"]
    assert ("`lxc.cgroup2.devices.allow: c 508:* rwm`" in sick["ct_config"]["fix"]
            and "`lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file`" in sick["ct_config"]["fix"]
            and "pct reboot 211" in sick["ct_config"]["fix"])
    assert not reports[f"{HOST}/{DRIVER_DEVICES}"]["ok"]

    full = rows(reports[f"{HOST}/{STORAGE}"])
    assert full["shm"]["status"] == "warn" and "/dev/shm is 16.0 MiB" in full["shm"]["detail"]
    assert "lxc.mount.entry: tmpfs dev/shm tmpfs size=16G" in full["shm"]["fix"]
    assert full["workdir"]["status"] == "fail" and "/workspace nearly full" in full["workdir"]["detail"]
    assert full["gpus_held"]["status"] == "warn" and "GPU 0 39.1 GiB at 0 %" in full["gpus_held"]["detail"]
    assert "GPU 1" not in full["gpus_held"]["detail"]
    assert full["limits"]["status"] == "warn" and full["limits"]["detail"].startswith("1 CPU(s)")
    assert "pct set 212 --cores 3" in full["limits"]["fix"]
    assert full["device_nodes"]["status"] == "fail"
    assert "/dev/nvidia-uvm is a file, not a device" in full["device_nodes"]["detail"]
    assert "nvidia-modprobe -u -c=0" in full["device_nodes"]["fix"]


def test_doctor_config_checks_what_the_trainer_needs(lab, planted, tiny, tmp_path, capsys) -> None:
    config = lab_configs.write_config(tmp_path / "shm.yaml", tiny, target_path="/dev/shm/model",
                                      output_dir="/workspace/out", device="cuda")
    code, table, err = cli(planted, "doctor", f"{HOST}/{STORAGE}", "--config", str(config), capsys=capsys)
    assert code == 1, err
    flat = " ".join(table.split())
    assert "config.target_path" in flat and "/dev/shm/model is on tmpfs (/dev/shm): lost on container" in flat
    assert "config.shm" in flat and "NCCL between 2 processes needs 1.0 GiB" in flat
    assert "config.checkpoints" in flat and "per checkpoint x 4 =" in flat
    code, _, err = cli(planted, "doctor", f"{HOST}/{STORAGE}", "--config", str(tmp_path / "nope.yaml"),
                       capsys=capsys)
    assert code == 2 and "nope.yaml" in err and "Traceback" not in err


def test_launch_with_the_target_on_tmpfs_is_refused_and_starts_with_force(lab, planted, tiny, tmp_path,
                                                                         capsys) -> None:
    config = lab_configs.write_config(tmp_path / "tmpfs.yaml", tiny, target_path="/dev/shm/model",
                                      max_steps=1000, checkpoint_every=0)
    target = f"{HOST}/{HEALTHY}"
    code, out, err = cli(planted, "launch", target, "--config", str(config), capsys=capsys)
    assert code == 2 and out == ""
    assert f"{target}: doctor found 1 problem(s), nothing was started (--force launches anyway)" in err
    assert "config.target_path: /dev/shm/model is on tmpfs (/dev/shm): lost on container restart; fix:" in err
    runs = lab.hosts[HOST].containers[HEALTHY].workspace / ".dflash" / "runs"
    assert not runs.exists() or not any(runs.iterdir())
    code, record, err = cli(planted, "launch", target, "--config", str(config), "--force", "--json", capsys=capsys)
    assert code == 0, err
    try:
        assert record["state"] == "running" and "fail: config.target_path" in err
    finally:
        code, result, _ = cli(planted, "kill", record["run_id"], "--grace", "2", "--json", capsys=capsys)
    assert code == 0 and result["targets"][target]["ok"]
