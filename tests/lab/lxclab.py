"""The lab's real LXC containers: what a lab host needs to run them (pct_lxc.py as its pct) and whether this machine
can. `Lab.start(root, LXC_SPEC, lxc=True)` builds a lab whose containers are real, unprivileged LXC containers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LXC_TOOLS = ("lxc-start", "lxc-stop", "lxc-attach", "lxc-info")
ID_RANGE = "100000:65536"  # the container ids 0..65535 on the host, as Proxmox maps them
REAPING_INIT = "lxc.init.cmd: /opt/lab/bin/reaping-init"
SYSTEMD_INIT = "lxc.init.cmd: /opt/lab/bin/systemd-init"  # systemd as PID 1, as far as the agent can tell
OOM_MEMORY_MIB = 192


def lxc_spec() -> tuple:
    """pve1: CT 200 (the seed run's 8 GPUs, a PID 1 that never reaps, --keep-env as PVE 8) and CT 202 (a reaping
    PID 1, 192 MiB of memory); pve2 (--clear-env as PVE 9): CT 300 with one idle GPU."""
    from tests.lab.lab import ContainerSpec, HostSpec, ct_config, seed_8gpu_state  # lab.py imports this module
    return (HostSpec("pve1", (ContainerSpec(200, gpus=seed_8gpu_state()),
                              ContainerSpec(202, config=ct_config(202, extra=(REAPING_INIT,)).replace(
                                  "memory: 65536", f"memory: {OOM_MEMORY_MIB}")))),
            HostSpec("pve2", (ContainerSpec(300, gpus=1),), attach_env="clear"))


def lxc_unavailable_reason() -> str | None:
    """Why real LXC containers cannot run here, or None when they can."""
    missing = [tool for tool in LXC_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the lab's LXC containers need {', '.join(missing)} (apt install lxc)"
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            ranges = Path(path).read_text().split()
        except OSError:
            ranges = []
        if f"root:{ID_RANGE}" not in ranges:
            return f"unprivileged LXC containers need the line root:{ID_RANGE} in {path}"
    return None


def install_pct(host_dir: Path, pct: Path, attach_env: str) -> None:
    """pct_lxc.py as the host's pct, pct_standin.py beside it (what the two share), the env mode of its
    `pct exec` and the host paths its containers see read-only (the Python the lab's inventory names)."""
    shutil.copy(HERE / "pct_lxc.py", pct)
    shutil.copy(HERE / "pct_standin.py", pct.parent / "pct_standin.py")
    pct.chmod(0o755)
    (host_dir / "attach-env").write_text(attach_env + "\n")
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    (host_dir / "lxc-binds").write_text("".join(p + "\n" for p in sorted(prefixes) if not p.startswith("/usr")))
    (host_dir / "lxcpath").mkdir(exist_ok=True)


def install_reaping_init(lab_dir: Path) -> None:
    """The inits a container's config may name: reaping-init (reaps, nothing else) and systemd-init (systemd_init.py:
    boots the units enabled in /etc/systemd/system, then reaps)."""
    for name, source in (("reaping-init", "reaping_init.py"), ("systemd-init", "systemd_init.py")):
        target = lab_dir / "bin" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / source, target)
        target.chmod(0o755)


def stop_containers(host_dir: Path, pct: str, netns: str, ctids: list[int]) -> None:
    for ctid in ctids:
        subprocess.run(["ip", "netns", "exec", netns, pct, "stop", str(ctid)], capture_output=True,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LAB_ROOT": str(host_dir.parent.parent),
                            "LAB_HOST": host_dir.name}, timeout=30)
