"""Starting processes that outlive us: fully detached from the caller's session, streams and process group."""
from __future__ import annotations

import os
import sys
import zipfile


def agent_entry() -> tuple:
    """(argv prefix, PYTHONPATH or None) that runs this agent again, as a zipapp or as a package."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if script and os.path.isfile(script) and zipfile.is_zipfile(script):
        return [sys.executable, script], None
    package = __package__ or "orchestrator.agent"
    top = os.path.dirname(os.path.abspath(__file__))
    for _ in package.split("."):
        top = os.path.dirname(top)
    return [sys.executable, "-m", package], top


def entry_env(env: dict, pythonpath: str | None) -> dict:
    env = dict(env)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def redirect_std_streams(log_path: str) -> None:
    """stdin from /dev/null, stdout+stderr appended to `log_path`, every other inherited fd closed.

    An fd left open towards the caller (pct exec's pipes above all) keeps the caller's session from ending.
    """
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass


def detach(argv: list, env: dict, log_path: str) -> int:
    """Run argv as a daemon (fork, setsid, fork again) and return its pid; we are never its parent."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        _detached_child(argv, env, log_path, read_fd, write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(child, 0)
    try:
        return int(data)
    except ValueError:
        raise OSError("could not start a detached process: {}".format(argv[:3]))


def _detached_child(argv: list, env: dict, log_path: str, read_fd: int, write_fd: int) -> None:
    try:
        os.close(read_fd)
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            exec_detached(argv, env, log_path)
        os.write(write_fd, str(grandchild).encode())
    finally:
        os._exit(0)


def exec_detached(argv: list, env: dict, log_path: str) -> None:
    """In a freshly forked child: drop every tie to the caller and exec argv. Never returns."""
    try:
        os.chdir("/")
        redirect_std_streams(log_path)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - a forked child must never return into its parent's code
        try:
            os.write(2, "exec {} failed: {}\n".format(argv[:3], exc).encode())
        finally:
            os._exit(127)
