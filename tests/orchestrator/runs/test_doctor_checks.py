"""doctor's judges on facts written by hand: what the lab cannot plant cheaply (a checkpoint that does not fit,
Proxmox's devN: passthrough, a host without the driver) and the parsing of what the host says."""
from __future__ import annotations

from dflash_records.plans import ProbeFacts
from orchestrator.inventory.model import load_inventory
from orchestrator.runs.doctor import FAIL, OK, WARN
from orchestrator.runs.doctor.checks import CHECKS, run_checks
from orchestrator.runs.doctor.config import checkpoint_space, drafter_params
from orchestrator.runs.doctor.facts import Facts, HostFacts, Needs, _parse_host_script
from orchestrator.runs.doctor.gpu import ct_devices, driver
from orchestrator.runs.doctor.pctconfig import parse_ct_config, size_bytes
from orchestrator.runs.doctor.report import see

QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128}
GIB = 1024 ** 3


def target(tmp_path, ctid: int | None = 200, gpus: int = 2):
    inv = tmp_path / "inventory.yaml"
    containers = f"    containers:\n      {ctid}: {{gpus: {gpus}}}\n" if ctid else ""
    inv.write_text(f"hosts:\n  pve1:\n    address: 10.0.0.1\n{containers}")
    return load_inventory(inv).target(f"pve1/{ctid}" if ctid else "pve1")


def needs(**overrides) -> Needs:
    values = dict(source="c.yaml", paths={"output_dir": "/workspace/out"}, keep_checkpoints=3, checkpoint_every=1000,
                  max_steps=0, num_workers=2, drafter_layers=5, cpu_only=False)
    return Needs(**{**values, **overrides})


def test_the_host_script_and_pct_config_are_read(tmp_path) -> None:
    facts = HostFacts()
    _parse_host_script("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n"
                       "--- gpus\n0000:18:00.0\n0000:2a:00.0\n--- devices\nCharacter devices:\n  1 mem\n"
                       "195 nvidia-frontend\n508 nvidia-uvm\n\nBlock devices:\n  7 nvidia-not-a-char\n"
                       "--- cpus\n64\n--- meminfo\nMemTotal:       528000000 kB\n", facts)
    assert (facts.module_version, facts.gpus, facts.cpus) == ("580.95.05", 2, 64)
    assert facts.majors == {"nvidia-frontend": 195, "nvidia-uvm": 508}
    ct = parse_ct_config("cores: 16\nmemory: 131072\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
                         "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                         "lxc.mount.entry: tmpfs dev/shm tmpfs size=32G,nosuid,nodev,create=dir 0 0\n"
                         "dev0: /dev/nvidia-uvm,gid=44\n#lxc.cgroup2.devices.allow: a\n")
    assert (ct.cores, ct.memory_mib, ct.shm_size) == (16, 131072, 32 * GIB)
    assert ct.allows(195) and not ct.allows(508) and ct.provides("/dev/nvidia0") and ct.provides("/dev/nvidia-uvm")
    assert parse_ct_config("arch: amd64\n").memory_mib == 512  # Proxmox's default
    assert size_bytes("512m") == 512 * 1024 ** 2 and size_bytes("50%") is None


def test_devN_passthrough_needs_no_cgroup_rule_but_a_bound_node_does(tmp_path) -> None:
    host = HostFacts(module_version="580.95.05", majors={"nvidia-frontend": 195, "nvidia-uvm": 508})
    host.ct = parse_ct_config("".join(f"dev{i}: {node}\n" for i, node in enumerate(
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"])))
    facts = Facts(target=target(tmp_path), host=host, probe=ProbeFacts(), expected_gpus=2)
    assert ct_devices(facts).status == OK
    host.ct = parse_ct_config("lxc.cgroup2.devices.allow: c 195:* rwm\n" + "".join(
        f"lxc.mount.entry: {n} {n[1:]} none bind,optional,create=file\n"
        for n in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1")))
    row = ct_devices(facts)
    assert row.status == FAIL and row.detail == "no lxc.cgroup2.devices.allow for nvidia-uvm (major 508)"
    assert "`lxc.cgroup2.devices.allow: c 508:* rwm`" in row.fix
    assert row.fix.endswith(see("devices"))  # the guide's section on device nodes (tests/test_docs.py: it exists)


def test_a_host_without_the_driver_and_a_container_without_its_library(tmp_path) -> None:
    facts = Facts(target=target(tmp_path), host=HostFacts(), probe=ProbeFacts(nvml={"version": "580.95.05"}),
                  expected_gpus=2)
    row = driver(facts)
    assert row.status == FAIL and "no NVIDIA kernel module on pve1" in row.detail and "modprobe nvidia" in row.fix
    facts.host.module_version, facts.probe.nvml["version"] = "580.95.05", None
    row = driver(facts)
    assert row.status == FAIL and "NVIDIA-Linux-x86_64-580.95.05.run --no-kernel-module" in row.fix
    assert row.fix.endswith("; see docs/proxmox.md#the-driver-twice-the-same-version")
    cpu_box = Facts(target=target(tmp_path, ctid=None, gpus=0), host=HostFacts(), probe=ProbeFacts(), expected_gpus=0)
    assert driver(cpu_box).status == OK
    assert all(row.status == OK for row in run_checks(cpu_box, CHECKS))


def test_the_checkpoints_must_fit_keep_checkpoints_times(tmp_path) -> None:
    params = drafter_params(QWEN3_8B, 5)
    assert params == 5 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 3 * 4096 * 12288) + 5 * 4096 * 4096
    probe = ProbeFacts(model={"config": QWEN3_8B}, paths={"/workspace/out": {"free_bytes": 40 * GIB}})
    facts = Facts(target=target(tmp_path), host=HostFacts(), probe=probe, expected_gpus=2, needs=needs())
    row = checkpoint_space(facts)
    assert row.status == FAIL and "x 4 =" in row.detail and "lower keep_checkpoints" in row.fix
    assert row.fix.endswith(see("room"))
    probe.paths["/workspace/out"]["free_bytes"] = 200 * GIB
    assert checkpoint_space(facts).status == OK
    facts.needs = needs(keep_checkpoints=0)
    assert checkpoint_space(facts).status == WARN  # every checkpoint kept, no end in sight
    facts.needs = needs(keep_checkpoints=0, max_steps=3000)
    assert "x 4 =" in checkpoint_space(facts).detail
