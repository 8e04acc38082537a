"""The storage checks: /dev/shm big enough and not hoarding data, the workdir on a disk with room and inodes."""
from __future__ import annotations

from dflash_records.protocol import GIB, MIB, low_free

from ...display import format_bytes
from .facts import Facts
from .report import FAIL, OK, WARN, Row, see

NCCL_SHM_BYTES = GIB          # NCCL between the GPUs of one node keeps its buffers in /dev/shm
MIN_SHM_BYTES = 64 * MIB      # Docker's famous default: too little for torch's shared tensors
SHM_KEPT_BYTES = GIB          # this much in /dev/shm is probably a model or a dataset, lost on restart
MIN_FREE_BYTES = GIB          # below this a checkpoint write fails
MIN_FREE_INODES = 10000


def shm_fix(facts: Facts, size: str = "16G") -> str:
    if facts.target.ctid is None:
        return f"remount it bigger: `mount -o remount,size={size} /dev/shm`"
    ct = facts.target.ctid
    return (f"add `lxc.mount.entry: tmpfs dev/shm tmpfs size={size},nosuid,nodev,create=dir 0 0` to "
            f"/etc/pve/lxc/{ct}.conf, then `pct reboot {ct}`; {see('shm')}")


def shm(facts: Facts) -> Row | None:
    fs = facts.probe.shm
    if not fs:
        return None
    if not fs.get("exists"):
        return Row("shm", FAIL, "/dev/shm does not exist: torch's data loading and NCCL need it", shm_fix(facts))
    size, free = fs.get("total_bytes") or 0, fs.get("free_bytes") or 0
    need = NCCL_SHM_BYTES if facts.nproc > 1 else MIN_SHM_BYTES
    if size < need:
        why = f"NCCL between {facts.nproc} GPUs fails with 'failed to extend /dev/shm'" if facts.nproc > 1 else \
            "torch's shared tensors need more"
        return Row("shm", WARN, f"/dev/shm is {format_bytes(size)}: {why}", shm_fix(facts))
    if size - free >= SHM_KEPT_BYTES:
        return Row("shm", WARN, f"{format_bytes(size - free)} kept in /dev/shm (tmpfs): lost on container restart",
                   f"move what lives there (models, datasets) to {facts.target.workdir}")
    return Row("shm", OK, f"/dev/shm {format_bytes(size)}, {format_bytes(free)} free")


def workdir(facts: Facts) -> Row | None:
    fs = facts.probe.workdir
    if not fs:
        return None
    where = facts.target.workdir
    if fs.get("fstype") in ("tmpfs", "ramfs"):
        return Row("workdir", FAIL, f"{where} is on {fs['fstype']}: runs, logs and checkpoints are lost on restart",
                   "put the workdir on disk (a mount point: `pct set CTID -mp0 STORAGE:SIZE,mp=/workspace`) and "
                   f"set `workdir:` in the inventory; {see('tmpfs')}")
    free, total = fs.get("free_bytes") or 0, fs.get("total_bytes") or 0
    inodes, inodes_total = fs.get("inodes_free"), fs.get("inodes_total") or 0
    found = (f"{format_bytes(free)} free of {format_bytes(total)}"
             + (f", {inodes} inodes free" if inodes_total else "") + f" ({fs.get('fstype', '?')})")
    fix = f"free space on {fs.get('mount_point', where)} (old checkpoints, caches) or grow the disk"
    if free < MIN_FREE_BYTES or (inodes_total and inodes is not None and inodes < MIN_FREE_INODES):
        return Row("workdir", FAIL, f"{where} nearly full: {found}", fix)
    if total and low_free(free, total, min_bytes=0):
        return Row("workdir", WARN, f"{where}: {found}", fix)
    return Row("workdir", OK, f"{where}: {found}")
