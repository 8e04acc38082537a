"""`probe`: what a GPU container offers a run, as facts for the controller's doctor to judge (it judges nothing).

One round trip answers: the /dev/nvidia* nodes (present, a character device, openable: a cgroup device rule
that does not allow them makes open() fail although the node is there), the version of the NVIDIA user-space
library (libnvidia-ml.so.<version>, which must equal the host's kernel module), the filesystems under the
workdir, /dev/shm and any paths asked about (type, free bytes and inodes: tmpfs is lost on a restart), the
CPUs and memory the container may use, the target model's config.json and size on disk, and the GPUs the
live runs of the runs directory claim (with nvidia-smi's numbers, which the controller has already, that tells
which GPUs hold memory no run accounts for).
"""
from __future__ import annotations

import glob
import json
import os
import stat

from dflash_records.plans import ProbeAnswer, ProbeFacts
from dflash_records.protocol import KIB, ascii_decimal

from .runstate import live_gpu_sets

# where distributions and NVIDIA's installer put the user-space driver (the loader's cache is not consulted:
# what a container's libnvidia-ml.so.1 resolves to is in one of these)
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/lib/x86_64-linux-gnu", "/lib64")
NVML = "libnvidia-ml.so."
MAX_WALK_FILES = 20000


def device_nodes(extra: list) -> dict:
    """path -> {"kind": char|file|dir|other|missing, "rdev": "MAJ:MIN", "error": open()'s error or None}."""
    found = {}
    for path in sorted(set(glob.glob("/dev/nvidia*")) | set(extra)):
        found[path] = _node(path)
    return found


def _node(path: str) -> dict:
    try:
        info = os.stat(path)
    except OSError:
        return {"kind": "missing", "rdev": None, "error": None}
    if not stat.S_ISCHR(info.st_mode):
        kind = "file" if stat.S_ISREG(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "other"
        return {"kind": kind, "rdev": None, "error": None, "size": info.st_size}
    node = {"kind": "char", "rdev": "{}:{}".format(os.major(info.st_rdev), os.minor(info.st_rdev)), "error": None}
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    except OSError as exc:
        node["error"] = exc.strerror or str(exc)
        node["errno"] = exc.errno
    return node


def nvml_library() -> dict:
    """{"version": "580.95.05", "path": ...} of the first libnvidia-ml.so.<version> found, else version None."""
    for lib_dir in LIB_DIRS:
        for path in sorted(glob.glob(os.path.join(lib_dir, NVML + "*"))):
            version = os.path.basename(path)[len(NVML):]
            if version.count(".") >= 1 and ascii_decimal(version.replace(".", "")) is not None:
                return {"version": version, "path": path}
    return {"version": None, "path": None}


def _mounts() -> list:
    """(mount point, fstype) of every mount, from /proc/self/mountinfo."""
    mounts = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) >= 5 and right:
                    point = fields[4].replace("\\040", " ")
                    mounts.append((point, right.split()[0]))
    except OSError:
        pass
    return mounts


def filesystem(path: str, mounts: list) -> dict:
    """Where `path` (or, when it does not exist yet, its nearest existing parent) lives, and its headroom."""
    real = os.path.realpath(path)
    probe = real
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    fs = {"path": path, "exists": os.path.exists(real), "is_dir": os.path.isdir(real), "resolved": real}
    inside = [(p, t) for p, t in mounts if probe == p or probe.startswith(p.rstrip("/") + "/") or p == "/"]
    if inside:
        fs["mount_point"], fs["fstype"] = max(inside, key=lambda m: len(m[0]))
    try:
        st = os.statvfs(probe)
        fs.update(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize,
                  inodes_total=st.f_files, inodes_free=st.f_favail)
    except OSError as exc:
        fs["error"] = exc.strerror
    return fs


def tree_size(path: str) -> int | None:
    """Bytes of the files under `path` (a model directory: a few large files); None past MAX_WALK_FILES."""
    total, count = 0, 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            count += 1
            if count > MAX_WALK_FILES:
                return None
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def model_config(path: str) -> dict | None:
    try:
        with open(os.path.join(path, "config.json")) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def limits() -> dict:
    """CPUs this process may run on, the cgroup's CPU quota and memory limit, and MemTotal (in bytes)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    mem_total = None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            mem_total = int(line.split()[1]) * KIB
    memory_max = _read("/sys/fs/cgroup/memory.max") or _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    return {"cpus": cpus, "cpu_max": _read("/sys/fs/cgroup/cpu.max"), "mem_total_bytes": mem_total,
            "memory_max_bytes": ascii_decimal(memory_max)}


def probe(*, workdir: str, runs_dir: str, paths: list, nodes: list, model: str | None) -> ProbeAnswer:
    mounts = _mounts()
    found = None
    if model is not None and os.path.isdir(model):
        found = {"config": model_config(model), "size_bytes": tree_size(model)}
    return ProbeAnswer(ok=True, probe=ProbeFacts(
        devices=device_nodes(nodes), nvml=nvml_library(), limits=limits(), workdir=filesystem(workdir, mounts),
        shm=filesystem("/dev/shm", mounts), paths={p: filesystem(p, mounts) for p in paths},
        live_gpus=tuple(live_gpu_sets(runs_dir)), model=found))
