"""What `pct config CTID` (the lines of /etc/pve/lxc/CTID.conf) says about a container's GPUs and limits.

Pure parsing: device rules (`lxc.cgroup2.devices.allow: c 195:* rwm`, `a` for everything), bind mounts of
device nodes (`lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file`), Proxmox's own
passthrough (`dev0: /dev/nvidia0`, which both allows and creates the node), a tmpfs on /dev/shm given a size
by a mount entry, and `cores:` / `memory:` (MiB; Proxmox's default is 512).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflash_records.protocol import ascii_decimal

DEFAULT_MEMORY_MIB = 512
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)i?b?$", re.IGNORECASE)


@dataclass
class CtConfig:
    allow: list[str] = field(default_factory=list)     # "c 195:* rwm", "a", ...
    mounted: set[str] = field(default_factory=set)     # /dev/... nodes bind-mounted into the container
    passthrough: set[str] = field(default_factory=set)  # devN: nodes
    cores: int | None = None
    memory_mib: int = DEFAULT_MEMORY_MIB
    shm_size: int | None = None                        # bytes, from a tmpfs mount entry on dev/shm

    def allows(self, major: int) -> bool:
        """Does a devices.allow rule let the container open character devices of this major?"""
        for rule in self.allow:
            parts = rule.split()
            if parts[:1] == ["a"]:
                return True
            if len(parts) >= 2 and parts[0] in ("c", "a") and "r" in (parts[2:3] or ["rwm"])[0]:
                dev_major = parts[1].split(":")[0]
                if dev_major in ("*", str(major)):
                    return True
        return False

    def provides(self, node: str) -> bool:
        return node in self.mounted or node in self.passthrough


def size_bytes(text: str) -> int | None:
    """tmpfs's size= (16G, 512m, 1073741824); None for a percentage or nonsense."""
    match = _SIZE.match(text.strip())
    if not match:
        return None
    power = " kmgt".index(match.group(2).lower() or " ")
    return int(float(match.group(1)) * 1024 ** power)


def parse_ct_config(text: str) -> CtConfig:
    config = CtConfig()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            config.allow.append(value)
        elif key == "lxc.mount.entry":
            _mount_entry(config, value.split())
        elif re.fullmatch(r"dev[0-9]+", key):
            config.passthrough.add(value.split(",")[0].strip())
        elif key == "cores":
            config.cores = ascii_decimal(value)
        elif key == "memory" and (mib := ascii_decimal(value)) is not None:
            config.memory_mib = mib
    return config


def _mount_entry(config: CtConfig, fields: list[str]) -> None:
    if len(fields) < 3:
        return
    source, dest, fstype = fields[:3]
    if dest.strip("/") == "dev/shm" and fstype == "tmpfs":
        options = dict(o.partition("=")[::2] for o in (fields[3] if len(fields) > 3 else "").split(","))
        config.shm_size = size_bytes(options.get("size", "")) if options.get("size") else None
    elif source.startswith("/dev/"):
        config.mounted.add("/" + dest.strip("/"))
