#!/usr/bin/python3
"""Proxmox VE's `pct` on a lab host over real LXC: lxc-start, lxc-attach, lxc-stop, lxc-info (installed as
<lab>/hosts/<host>/bin/pct, with pct_standin.py beside it for what both share: CT configs, status, list, config,
push, pull).

A container is a real LXC container named by its CTID (lxc path <lab>/hosts/<host>/lxcpath), built on start from
its Proxmox config <lab>/hosts/<host>/lxc/<id>.conf as Proxmox builds /var/lib/lxc/<id>/config:
  - `unprivileged: 1` maps the container's ids 0..65535 onto the host's 100000.. (Proxmox's default; the host's
    /etc/subuid and /etc/subgid must give root that range);
  - `memory: MiB` is the memory cgroup's limit (a real OOM kill past it), `cores: N` a cpuset of N CPUs;
  - `lxc.*` lines are passed on (`lxc.cgroup2.*` become `lxc.cgroup.*` on a host whose controllers are cgroup
    v1); `lxc.init.cmd: CMD` sets PID 1, by default `sleep infinity`, which never reaps; a CMD naming the lab's
    systemd-init (systemd_init.py) boots it as systemd would: a tmpfs on /run, and the container's own writable
    <ct>/systemd bound over /etc/systemd/system (kept across reboots, as a container's /etc is);
  - /dev/shm is a fresh tmpfs (gone on stop and reboot) unless the config mounts its own.
The root file system is a directory of empty mount points: the host's /usr and /etc and every path listed in
<lab>/hosts/<host>/lxc-binds (the lab's Python) bound read-only, the container's persistent directory on
/workspace, its lab directory on /opt/lab (and on /usr/local/sbin an `nvidia-smi` that runs the fake one), the host's
/proc/driver on /proc/driver, the container's <ct>/lib (libnvidia-ml.so.<version>) laid over the system library
directory, its own cgroups on /sys/fs/cgroup (no sysfs: mounting one needs a network
namespace of its own). The container shares its host's network namespace (Proxmox gives it a veth).

`pct exec CTID [--] CMD...` is `exec lxc-attach -n CTID --keep-env -- CMD...` as on PVE 8, or `--clear-env` (PVE 9)
when <lab>/hosts/<host>/attach-env says `clear`: exit codes, signals and stdio are lxc-attach's own.
`pct reboot` is stop + start. The init's host pid and start time are kept in <lab>/hosts/<host>/ct/<id>/init.json
while it runs, as the stand-in keeps them. Every error of pct itself exits 2.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pct_standin as standin  # noqa: E402  (installed beside this file)

ID_BASE, ID_COUNT = 100000, 65536
CGROUPS = Path("/sys/fs/cgroup")
HIERARCHIES = [line.split(":", 2)[1] for line in Path("/proc/self/cgroup").read_text().splitlines()]
LEGACY_CGROUPS = any("memory" in h.split(",") for h in HIERARCHIES)  # a cgroup v1 memory controller
MS_REC, MS_PRIVATE = 16384, 1 << 18
ROOT_DIRS = ("usr", "etc", "proc", "sys/fs/cgroup", "dev", "tmp", "root", "run", "var/tmp", "workspace", "opt/lab")
DEFAULT_INIT = "/usr/bin/sleep infinity"
SYSTEMD_INIT = "systemd-init"  # the lab's stand-in for systemd as PID 1 (tests/lab/systemd_init.py)


def host_dir() -> Path:
    root, host = standin.host_dirs()
    return root / "hosts" / host


def lxc(tool: str, ctid: int, *args: str) -> list[str]:
    return [f"lxc-{tool}", "-P", str(host_dir() / "lxcpath"), "-n", str(ctid), *args]


def unprivileged(container: standin.Container) -> bool:
    return container.config().get("unprivileged", "0").strip() == "1"


def systemd_like(container: standin.Container) -> bool:
    return SYSTEMD_INIT in container.config().get("lxc.init.cmd", "")


def read_binds() -> list[str]:
    try:
        return [line.strip() for line in (host_dir() / "lxc-binds").read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


# ---- the LXC config and root file system ----------------------------------------------------------------

def passed_on(key: str, value: str) -> str:
    """One `lxc.*` line of the CT config as LXC gets it."""
    if LEGACY_CGROUPS and key.startswith("lxc.cgroup2."):
        key = "lxc.cgroup." + key[len("lxc.cgroup2."):]
    fields = value.split()
    if key == "lxc.mount.entry" and fields and fields[0].startswith("/dev/nvidia"):
        fields[0] = str(host_dir() / fields[0].lstrip("/"))  # the lab host's stand-in nodes
        value = " ".join(fields)
    return f"{key} = {value}"


def lxc_config(container: standin.Container, rootfs: Path) -> str:
    config, entries = container.config(), container.entries()
    lines = [f"lxc.uts.name = {config.get('hostname', f'ct{container.ctid}')}",
             f"lxc.rootfs.path = dir:{rootfs}", "lxc.net.0.type = none", "lxc.apparmor.profile = unconfined",
             "lxc.autodev = 1", "lxc.tty.max = 0", "lxc.pty.max = 16", "lxc.mount.auto = proc:mixed cgroup:mixed:force",
             f"lxc.init.cmd = {config.get('lxc.init.cmd', DEFAULT_INIT)}"]
    if unprivileged(container):
        lines += [f"lxc.idmap = {kind} 0 {ID_BASE} {ID_COUNT}" for kind in "ug"]
    driver = host_dir() / "proc" / "driver"
    if driver.is_dir():
        lines.append(f"lxc.mount.entry = {driver} proc/driver none bind,optional 0 0")
    if not any(k == "lxc.mount.entry" and v.split()[1:2] in (["dev/shm"], ["/dev/shm"]) for k, v in entries):
        lines.append("lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0")
    if systemd_like(container):
        lines.append("lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755 0 0")
    memory = config.get("memory", "")
    if memory.isdigit():
        lines.append(f"lxc.cgroup.memory.limit_in_bytes = {memory}M" if LEGACY_CGROUPS
                     else f"lxc.cgroup2.memory.max = {memory}M")
    cores = config.get("cores", "")
    if cores.isdigit():
        cpus = sorted(os.sched_getaffinity(0))[:max(int(cores), 1)]
        lines.append(f"lxc.cgroup{'' if LEGACY_CGROUPS else '2'}.cpuset.cpus = {','.join(map(str, cpus))}")
    lines += [passed_on(k, v) for k, v in entries if k.startswith("lxc.") and k != "lxc.init.cmd"]
    if any(line.startswith("lxc.mount.entry = " + str(host_dir() / "dev")) for line in lines):
        # the lab host's GPU nodes are stand-ins with /dev/null's numbers: the device rules must let them open
        lines.append(f"lxc.cgroup{'' if LEGACY_CGROUPS else '2'}.devices.allow = c 1:3 rwm")
    return "".join(line + "\n" for line in lines)


def make_rootfs(container: standin.Container, rootfs: Path) -> None:
    """Empty mount points (made once, kept): the host's top-level links (bin -> usr/bin...) copied as links."""
    if (rootfs / "usr").is_dir():
        return
    for name in ROOT_DIRS:
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            (rootfs / name).symlink_to(os.readlink(top))
        elif top.is_dir():
            (rootfs / name).mkdir()
    for path in read_binds():
        (rootfs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if unprivileged(container):
        subprocess.run(["chown", "-R", "-h", f"{ID_BASE}:{ID_BASE}", str(rootfs)], check=True)


def bind(source: str, target: Path, *, read_only: bool) -> None:
    subprocess.run(["mount", "--rbind", source, str(target)], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)


def mount_and_start(ctid_text: str) -> None:
    """In a mount namespace of its own (so none of this shows on the host): bind what the container sees of the
    host into its root directory as host root (an unprivileged container's root could not reach paths under a
    0700 directory such as /root), then become lxc-start, whose container inherits these mounts."""
    container = standin.Container(ctid_text)
    rootfs = host_dir() / "lxcpath" / str(container.ctid) / "rootfs"
    for top in ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if (rootfs / top).is_dir() and not (rootfs / top).is_symlink():
            bind(f"/{top}", rootfs / top, read_only=True)
    for path in read_binds():
        bind(path, rootfs / path.lstrip("/"), read_only=True)
    if systemd_like(container):
        bind(str(container.dir / "systemd"), rootfs / "etc" / "systemd" / "system", read_only=False)
    bind(str(container.dir / "lab"), rootfs / "opt" / "lab", read_only=False)
    wrappers = container.dir / "sbin"  # nvidia-smi where both env modes' PATH finds it (it lives in /usr/bin)
    wrappers.mkdir(exist_ok=True)
    (wrappers / "nvidia-smi").write_text('#!/bin/sh\nexec /opt/lab/bin/nvidia-smi "$@"\n')
    (wrappers / "nvidia-smi").chmod(0o755)
    bind(str(wrappers), rootfs / "usr" / "local" / "sbin", read_only=True)
    bind(str(container.dir / "workspace"), rootfs / "workspace", read_only=False)
    system = next((d for d in ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu") if (rootfs / d).is_dir()), "")
    if system and (container.dir / "lib").is_dir():  # libnvidia-ml.so.<version>, where NVIDIA's installer puts it
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={container.dir / 'lib'}:/{system}",
                        str(rootfs / system)], check=True)
    os.execvp("lxc-start", lxc("start", container.ctid, "-l", "INFO", "-o", str(container.dir / "lxc.log")))


def see_host_cgroups() -> None:
    """`ip netns exec` (and so each lab host's sshd) mounts a fresh sysfs on /sys, without the machine's cgroup
    file systems; lxc-start and lxc-attach find cgroups there. In a mount namespace of this process's own, bind
    the machine's back (a real Proxmox host has them where they belong)."""
    if any(CGROUPS.iterdir()):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(standin.CLONE_NEWNS) != 0:
        raise standin.PctError(f"unshare: {os.strerror(ctypes.get_errno())}")
    standin.libc_mount("none", "/", None, MS_REC | MS_PRIVATE)
    legacy = [h for h in HIERARCHIES if h]
    if not legacy:  # cgroup v2 only
        standin.libc_mount("cgroup2", str(CGROUPS), "cgroup2", 0)
        return
    standin.libc_mount("tmpfs", str(CGROUPS), "tmpfs", 0, "mode=755")
    for hierarchy in legacy:  # the same hierarchies again (mounting one with the same options reuses it)
        target = CGROUPS / hierarchy.replace("name=", "")
        target.mkdir()
        standin.libc_mount("cgroup", str(target), "cgroup", 0,
                           hierarchy if not hierarchy.startswith("name=") else "none," + hierarchy)
    if "" in HIERARCHIES:
        (CGROUPS / "unified").mkdir()
        standin.libc_mount("cgroup2", str(CGROUPS / "unified"), "cgroup2", 0)


# ---- commands -------------------------------------------------------------------------------------------

def state(ctid: int) -> str:
    result = subprocess.run(lxc("info", ctid, "-sH"), capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "STOPPED"


def cmd_start(args: list[str]) -> int:
    container = standin.Container(args[0])
    if state(container.ctid) != "STOPPED":
        raise standin.PctError(f"CT {container.ctid} already running")
    base = host_dir() / "lxcpath" / str(container.ctid)
    make_rootfs(container, base / "rootfs")
    (base / "config").write_text(lxc_config(container, base / "rootfs"))
    workspace = container.dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (container.dir / "lab").mkdir(parents=True, exist_ok=True)
    owned = [workspace] + ([container.dir / "systemd"] if systemd_like(container) else [])
    for path in owned:
        path.mkdir(exist_ok=True)
        if unprivileged(container) and path.stat().st_uid == 0:
            os.chown(path, ID_BASE, ID_BASE)  # the container's root owns its /workspace (and its units)
    container.init_file.unlink(missing_ok=True)
    with open(container.dir / "start.log", "w+") as log:  # lxc-start's monitor stays: no pipe of ours
        started = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-S",
                                  os.path.abspath(__file__), "__mount_and_start", str(container.ctid)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.seek(0)
        errors = log.read().strip()
    pid = subprocess.run(lxc("info", container.ctid, "-pH"), capture_output=True, text=True).stdout.strip()
    if started.returncode != 0 or not pid.isdigit():
        raise standin.PctError(f"CT {container.ctid} failed to start: {errors} "
                               f"(see {container.dir / 'lxc.log'})")
    tmp = container.init_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": int(pid), "start_time": standin.process_start_time(int(pid))}))
    os.replace(tmp, container.init_file)
    return 0


def cmd_stop(args: list[str]) -> int:
    container = standin.Container(args[0])
    if state(container.ctid) == "STOPPED":
        raise standin.PctError(f"CT {container.ctid} not running")
    subprocess.run(lxc("stop", container.ctid, "-k"), capture_output=True)
    container.init_file.unlink(missing_ok=True)
    return 0


def cmd_reboot(args: list[str]) -> int:
    cmd_stop(args)
    return cmd_start(args)


def cmd_exec(args: list[str]) -> int:
    if not args:
        raise standin.PctError("400 not enough arguments\n" + standin.USAGE)
    container = standin.Container(args[0])
    argv = args[2:] if args[1:2] == ["--"] else args[1:]
    if not argv:
        raise standin.PctError("missing command")
    if state(container.ctid) != "RUNNING":
        raise standin.PctError(f"CT {container.ctid} not running")
    try:
        mode = (host_dir() / "attach-env").read_text().strip()
    except FileNotFoundError:
        mode = "keep"
    os.execvp("lxc-attach", lxc("attach", container.ctid, f"--{mode}-env", "--", *argv))
    return 126


def cmd_push(args: list[str]) -> int:
    code = standin.cmd_push(args)
    container = standin.Container(args[0])
    if unprivileged(container):  # Proxmox writes the file as the container's root
        os.chown(f"/proc/{container.running_pid()}/root" + os.path.join("/", args[2]), ID_BASE, ID_BASE)
    return code


COMMANDS = {**standin.COMMANDS, "start": cmd_start, "stop": cmd_stop, "reboot": cmd_reboot, "exec": cmd_exec,
            "push": cmd_push}


def main(argv: list[str]) -> int:
    if argv[:1] == ["__mount_and_start"]:
        mount_and_start(argv[1])
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(("unknown command 'pct %s'\n" % argv[0] if argv else "") + standin.USAGE)
        return 2
    try:
        if argv[0] in standin.NEEDS_CTID and len(argv) < 2:
            raise standin.PctError("400 not enough arguments\n" + standin.USAGE)
        if argv[0] in ("start", "exec", "reboot"):
            see_host_cgroups()
        return COMMANDS[argv[0]](argv[1:])
    except standin.PctError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
