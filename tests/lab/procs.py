"""Reading a container's processes from the host's /proc, numbered as the container sees them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcInfo:
    pid: int                 # in the container's pid namespace
    ppid: int                # in the container's pid namespace; 0 when the parent is outside it
    state: str               # the letter of /proc/PID/stat: R, S, D, T, Z...
    name: str                # comm, which zombies keep although their cmdline is gone
    cmdline: list[str]
    environ: dict[str, str] = field(default_factory=dict)
    host_pid: int = 0


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _status_fields(host_pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{host_pid}/status")
    if raw is None:
        return None
    pairs = (line.split(":", 1) for line in raw.decode(errors="replace").splitlines() if ":" in line)
    return {key: value.strip() for key, value in pairs}


def _environ(host_pid: int) -> dict[str, str]:
    raw = _read(f"/proc/{host_pid}/environ") or b""
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return dict(pairs)


def _state_letter(host_pid: int) -> str | None:
    raw = _read(f"/proc/{host_pid}/stat")
    return raw.rsplit(b")", 1)[1].split()[0].decode() if raw else None


def pids_in_namespace(ns_link: str) -> list[int]:
    """Host pids of the processes whose pid namespace is ns_link (e.g. 'pid:[4026532301]')."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns_link:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def container_processes(init_host_pid: int) -> list[ProcInfo]:
    ns_link = os.readlink(f"/proc/{init_host_pid}/ns/pid")
    raw: dict[int, tuple[dict[str, str], str]] = {}
    for host_pid in pids_in_namespace(ns_link):
        status, state = _status_fields(host_pid), _state_letter(host_pid)
        if status is not None and state is not None:
            raw[host_pid] = (status, state)
    inner_pid = {hp: int(status["NSpid"].split()[-1]) for hp, (status, _) in raw.items()}
    result = []
    for host_pid, (status, state) in raw.items():
        cmdline = _read(f"/proc/{host_pid}/cmdline") or b""
        cmdline = cmdline[:-1] if cmdline.endswith(b"\0") else cmdline
        result.append(ProcInfo(
            pid=inner_pid[host_pid],
            ppid=inner_pid.get(int(status.get("PPid", "0")), 0),
            state=state,
            name=status.get("Name", ""),
            cmdline=[arg.decode(errors="replace") for arg in cmdline.split(b"\0")] if cmdline else [],
            environ=_environ(host_pid),
            host_pid=host_pid,
        ))
    return sorted(result, key=lambda proc: proc.pid)
