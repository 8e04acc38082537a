#!/usr/bin/python3
"""PID 1 that boots a lab container as systemd boots a Proxmox one, as far as dflashctl can tell
(`lxc.init.cmd: /opt/lab/bin/systemd-init`): it says it is systemd (/run/systemd/system, on the tmpfs pct_lxc.py
mounts on /run for it), starts the units enabled in /etc/systemd/system/multi-user.target.wants/ (a writable
directory of the container's own, bound over the host's) one after another, and then becomes reaping-init
(reaping_init.py), which reaps every child, its own and the orphans it inherits, until SIGTERM, SIGINT or SIGPWR.

Of a unit it reads ExecStart (a leading `-` ignored, arguments quoted and escaped as systemd reads them), Type
(oneshot and forking are waited for, simple is not) and Environment; each runs with systemd's environment for
system services (its PATH, no HOME unless the unit sets one), stdin from /dev/null and stdout and stderr appended
to /run/lab-units.log (the lab's view of the journal: `<unit>: started|exit N` lines and what the command says).
"""
import os
import shlex
import signal
import sys

UNITS = "/etc/systemd/system"
WANTS = UNITS + "/multi-user.target.wants"
JOURNAL = "/run/lab-units.log"
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def read_unit(path: str) -> dict:
    """The [Service] keys this init honours: ExecStart (argv), Type, Environment (a dict)."""
    unit = {"Type": "simple", "Environment": {}}
    section = ""
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            key, _, value = line.partition("=")
            if section != "[Service]":
                continue
            if key == "ExecStart":
                unit["ExecStart"] = [_unescape(word) for word in shlex.split(value.lstrip("-@:+!"))]
            elif key == "Type":
                unit["Type"] = value.strip()
            elif key == "Environment":
                for pair in shlex.split(value):
                    name, _, val = pair.partition("=")
                    unit["Environment"][name] = _unescape(val)
    return unit


def _unescape(word: str) -> str:
    return word.replace("$$", "\0").replace("%%", "%").replace("\0", "$")


def journal(message: str) -> None:
    with open(JOURNAL, "a") as log:
        log.write(message + "\n")


def start(name: str, unit: dict) -> None:
    argv = unit.get("ExecStart")
    if not argv:
        journal(f"{name}: no ExecStart")
        return
    env = {"PATH": SERVICE_PATH, "LANG": "C.UTF-8", **unit["Environment"]}
    journal(f"{name}: started {' '.join(argv)}")
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir("/")
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    if unit["Type"] in ("oneshot", "forking"):
        while True:
            reaped, status = os.wait()  # orphans reaped meanwhile, as systemd does
            if reaped == pid:
                journal(f"{name}: exit {os.waitstatus_to_exitcode(status)}")
                return


def boot() -> None:
    os.makedirs("/run/systemd/system", exist_ok=True)
    try:
        names = sorted(os.listdir(WANTS))
    except FileNotFoundError:
        names = []
    for name in names:
        if not name.endswith(".service"):
            continue
        try:
            start(name, read_unit(os.path.join(WANTS, name)))
        except OSError as exc:
            journal(f"{name}: {exc}")


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPWR):
        signal.signal(sig, lambda *_: sys.exit(0))
    boot()
    # then reap as the plain init does, as PID 1 still: it inherits the units' processes
    reaper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaping-init")
    os.execv(reaper, [reaper])


if __name__ == "__main__":
    main()
