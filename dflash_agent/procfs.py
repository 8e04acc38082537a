"""Reading /proc: process identity (pid + start time), parents, environments, zombies."""
from __future__ import annotations

import os

from dflash_records.protocol import ascii_decimal


class ProcStat:
    """The fields of /proc/PID/stat the agent needs."""

    __slots__ = ("pid", "comm", "state", "ppid", "pgid", "sid", "start_time")

    def __init__(self, pid: int, comm: str, state: str, ppid: int, pgid: int, sid: int, start_time: int) -> None:
        self.pid = pid
        self.comm = comm
        self.state = state
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.start_time = start_time

    @property
    def is_zombie(self) -> bool:
        return self.state in ("Z", "X", "x")


def parse_stat(pid: int, data: bytes) -> ProcStat:
    # comm may contain spaces and parentheses: it ends at the LAST ')'.
    close = data.rindex(b")")
    comm = data[data.index(b"(") + 1:close].decode("utf-8", "replace")
    fields = data[close + 2:].split()
    # fields[0] is field 3 of proc(5); start time is field 22.
    return ProcStat(pid, comm, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open("/proc/{}/stat".format(pid), "rb") as handle:
            return parse_stat(pid, handle.read())
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.start_time if stat else None


def is_alive(pid: int | None, expected_start: int | None) -> bool:
    """True when `pid` runs (not a zombie) and is the same process that had `expected_start`."""
    if not pid:
        return False
    stat = read_stat(pid)
    if stat is None or stat.is_zombie:
        return False
    return expected_start is None or stat.start_time == expected_start


def exists_as(pid: int, expected_start: int) -> bool:
    """True while the process (even as a zombie) still occupies its pid."""
    stat = read_stat(pid)
    return stat is not None and stat.start_time == expected_start


def boot_id() -> str | None:
    """Changes at every boot of the kernel: with it, a pid + start time from before a reboot never matches."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return None


INITIAL_PID_NS = 0xEFFFFFFC  # the inode of the host's own PID namespace: a constant of the kernel


def in_initial_pid_namespace() -> bool:
    """True on the host itself, False inside a container (a PID namespace of its own)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == INITIAL_PID_NS
    except OSError:
        return False


def list_pids() -> list:
    return [pid for pid in map(ascii_decimal, os.listdir("/proc")) if pid is not None]


def snapshot() -> dict:
    """pid -> ProcStat for every process visible now."""
    table = {}
    for pid in list_pids():
        stat = read_stat(pid)
        if stat is not None:
            table[pid] = stat
    return table


def descendants(table: dict, root: int) -> list:
    """Every process whose parent chain reaches `root` (root itself excluded)."""
    children = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def session_members(table: dict, sid: int | None, leader_start: int | None) -> list:
    """Live processes of the session that `sid` led, its leader having started at `leader_start`: a run's
    workload leads its own session, and a child that cleared its environment or lost its parent stays in it.
    A pid cannot be reused while a session still carries it, so members that outlive the leader are safe to
    count; a leader pid now held by another process means the session is not ours."""
    if not sid or leader_start is None:
        return []
    leader = table.get(sid)
    if leader is not None and leader.start_time != leader_start:
        return []
    return sorted(pid for pid, stat in table.items()
                  if stat.sid == sid and not stat.is_zombie and stat.start_time >= leader_start)


def own_lineage() -> set:
    """This process and its ancestors: never signalled by the agent, whatever their environment says."""
    lineage, pid = set(), os.getpid()
    while pid > 0 and pid not in lineage:
        lineage.add(pid)
        stat = read_stat(pid)
        pid = stat.ppid if stat else 0
    return lineage


def read_environ(pid: int) -> dict | None:
    try:
        with open("/proc/{}/environ".format(pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    env = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def read_argv(pid: int) -> list:
    try:
        with open("/proc/{}/cmdline".format(pid), "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in data.split(b"\0") if part]


def read_cmdline(pid: int) -> str:
    return " ".join(read_argv(pid))


def namespace(pid, kind: str) -> tuple | None:
    """(device, inode) of the `kind` namespace ("pid", "mnt") of `pid` ("self" for us): equal for two processes
    exactly when they share it. None where it cannot be read (the process is gone, or not ours to inspect)."""
    try:
        info = os.stat("/proc/{}/ns/{}".format(pid, kind))
    except OSError:
        return None
    return info.st_dev, info.st_ino


def in_our_pid_namespace(pid: int) -> bool:
    """`pid` lives in our PID namespace: seen from a host, a container's processes never do."""
    ours = namespace("self", "pid")
    return ours is not None and namespace(pid, "pid") == ours


def sees_as_ours(pid: int, path: str) -> bool:
    """`path`, as `pid` sees it (its root, its mount namespace), is the very file we see there. A container's
    /workspace is not its host's /workspace, however alike the two paths read."""
    try:
        theirs = os.stat("/proc/{}/root{}".format(pid, os.path.abspath(path)))
        ours = os.stat(path)
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def processes_with_env(key: str, table: dict | None = None) -> dict:
    """pid -> (value of `key`, environment) for every live process whose environment sets `key`."""
    table = snapshot() if table is None else table
    skip = own_lineage()
    found = {}
    for pid, stat in table.items():
        if pid in skip or stat.is_zombie:
            continue
        env = read_environ(pid)
        if env and key in env:
            found[pid] = (env[key], env)
    return found


def describe(pid: int) -> dict:
    stat = read_stat(pid)
    return {"pid": pid, "cmdline": read_cmdline(pid) or (stat.comm if stat else ""),
            "state": stat.state if stat else None}


def catches_signal(pid: int, signum: int) -> bool:
    """`pid` has a handler of its own for `signum` (SigCgt of /proc/PID/status): sending it does not end it."""
    try:
        with open("/proc/{}/status".format(pid)) as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False
