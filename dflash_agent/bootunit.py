"""The queue's boot hook: a systemd unit that resumes a runs directory's queue when the container boots.

A Proxmox container made from a Debian or Ubuntu template boots systemd as its PID 1. Where it did (sd_booted: the
directory /run/systemd/system exists) and /etc/systemd/system is writable, the agent writes one unit per runs
directory (`dflash-queue-<hash of its path>.service`) and enables it as `systemctl enable` does, with the link in
multi-user.target.wants (no systemctl call: it may be missing). At boot the unit runs this agent's `resume`, which
starts the keeper when runs are queued, so the queue goes on with no dflashctl call. The unit names the agent that
wrote it (a deployed agent's path carries its version); any agent call that finds runs queued rewrites it when it
names another agent. Elsewhere nothing is written, and the queue resumes at the next agent call instead.

The unit is Type=oneshot with RemainAfterExit: `resume` returns once the keeper is started (detached), and the
keeper, with every run it starts after, stays in the unit's cgroup; KillMode=process keeps a stop of the unit from
ending them. A boot that finds the queue empty removes the unit (the next queued run writes it again).
"""
from __future__ import annotations

import hashlib
import os

from .spawn import agent_entry

# Where systemd keeps its own state and its units; DFLASH_SYSTEMD_ROOT puts both under another root (the tests do,
# so that an agent run on a systemd machine does not write into its /etc).
SYSTEMD_RUN = "run/systemd/system"
UNIT_DIR = "etc/systemd/system"
WANTS = "multi-user.target.wants"


def _root() -> str:
    return os.environ.get("DFLASH_SYSTEMD_ROOT") or "/"


def unit_dir() -> str:
    return os.path.join(_root(), UNIT_DIR)


def unit_name(runs_dir: str) -> str:
    digest = hashlib.sha256(os.path.abspath(runs_dir).encode("utf-8", "surrogateescape")).hexdigest()
    return "dflash-queue-{}.service".format(digest[:12])


def sd_booted() -> bool:
    """systemd's own test (sd_booted(3)): it booted this system when /run/systemd/system exists."""
    return os.path.isdir(os.path.join(_root(), SYSTEMD_RUN))


def available() -> bool:
    """A boot unit can be installed here: systemd booted the container and its unit directory is writable."""
    return sd_booted() and os.access(unit_dir(), os.W_OK)


def _paths(runs_dir: str) -> tuple:
    name = unit_name(runs_dir)
    return os.path.join(unit_dir(), name), os.path.join(unit_dir(), WANTS, name)


def installed(runs_dir: str) -> bool:
    """The unit of this runs directory is written and enabled, on a system systemd booted."""
    unit, link = _paths(runs_dir)
    return sd_booted() and os.path.isfile(unit) and os.path.realpath(link) == os.path.realpath(unit)


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def _word(arg: str) -> str:
    """One argument of ExecStart= or Environment= as systemd reads it back."""
    arg = _escape(arg).replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(runs_dir: str) -> str:
    runs_dir = os.path.abspath(runs_dir)
    entry, pythonpath = agent_entry()
    program = entry[1] if len(entry) == 2 else (pythonpath or entry[0])  # the zipapp, or the package's top
    env = [("HOME", os.environ.get("HOME") or "/root")] + ([("PYTHONPATH", pythonpath)] if pythonpath else [])
    lines = ["# Written by the dflash agent: resumes the GPU queue of this runs directory at boot (with no run",
             "# queued it does nothing, and removes this unit).",
             "[Unit]", "Description=dflash GPU queue of " + _escape(runs_dir),
             "After=local-fs.target remote-fs.target",
             "ConditionPathIsDirectory=" + _escape(runs_dir), "ConditionPathExists=" + _escape(program), "",
             "[Service]", "Type=oneshot", "RemainAfterExit=yes", "KillMode=process",
             *("Environment=" + _word("{}={}".format(k, v)) for k, v in env),
             "ExecStart=" + " ".join(_word(a) for a in entry + ["resume", "--runs-dir", runs_dir]), "",
             "[Install]", "WantedBy=multi-user.target"]
    return "".join(line + "\n" for line in lines)


def install(runs_dir: str) -> bool:
    """Write and enable the unit where systemd booted us and /etc/systemd/system is writable (rewritten only when
    its text changed); True when it is in place. Nothing here fails a call: the next contact stays the fallback."""
    if not available() or any(c in os.path.abspath(runs_dir) for c in "\n\r"):
        return False
    unit, link = _paths(runs_dir)
    text = unit_text(runs_dir)
    try:
        try:
            with open(unit, encoding="utf-8") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = None
        if current != text:
            tmp = "{}.tmp.{}".format(unit, os.getpid())
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, unit)
        if os.path.realpath(link) != os.path.realpath(unit):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.join("/", UNIT_DIR, os.path.basename(unit)) if _root() == "/" else unit, link)
    except OSError:
        return False
    return True


def remove(runs_dir: str) -> None:
    """Disable and delete the unit (a queue that is empty at boot needs none)."""
    for path in reversed(_paths(runs_dir)):
        try:
            os.unlink(path)
        except OSError:
            pass
