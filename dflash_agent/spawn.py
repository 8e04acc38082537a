"""Starting processes that outlive us: fully detached from the caller's session, streams and process group."""
from __future__ import annotations

import os
import signal
import sys
import zipfile

CLONE_PARENT = 0x00008000
# clone(2) where its first argument is the flags; a fork-like clone leaves the others 0, whatever their order
CLONE_SYSCALLS = {"x86_64": 56, "aarch64": 220}


def agent_entry() -> tuple:
    """(argv prefix, PYTHONPATH or None) that runs this agent again, as a zipapp or as a package."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if script and os.path.isfile(script) and zipfile.is_zipfile(script):
        return [sys.executable, script], None
    package = __package__ or "dflash_agent"
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
    """Run argv as a daemon (a session of its own, every stream redirected) and return its pid; we are never
    its parent.

    Its parent is whoever must reap it when it exits. Entered into a container by pct exec (lxc-attach) or
    nsenter, our own parent lives outside the container's PID namespace (getppid() is 0): the daemon is made
    our sibling, a child of that outside process (clone with CLONE_PARENT, the way lxc-attach starts us), and
    once that process exits, of the host's init; both reap. A double fork would hand it to the container's
    PID 1, which may never reap: its exit would leave a zombie until the container restarts. Elsewhere (a
    host, or where that clone is refused), the double fork: the init it reaches is the host's own.
    """
    if os.getppid() == 0:
        pid = _start_beside_parent(argv, env, log_path)
        if pid is not None:
            return pid
    return _double_fork(argv, env, log_path)


def _start_beside_parent(argv: list, env: dict, log_path: str) -> int | None:
    # close-on-exec: the read below ends once the child has called setsid and exec'd (or died), so the
    # caller never returns (and pct never kills its process group) while the child is still in that group
    read_fd, write_fd = os.pipe()
    pid = _clone_beside_parent()
    if pid == 0:
        try:
            os.setsid()
        except OSError:
            os._exit(127)
        exec_detached(argv, env, log_path)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        if pid is not None:
            pipe.read()
    return pid


def _clone_beside_parent() -> int | None:
    """fork(), except that the child's parent is our parent: 0 in the child, its pid here, None where this
    kernel, architecture or Python cannot do it."""
    number = CLONE_SYSCALLS.get(os.uname().machine)
    if number is None:
        return None
    try:
        import ctypes
        # PyDLL: the GIL stays held across the call, as os.fork holds it, so the child starts consistent
        syscall = ctypes.PyDLL(None, use_errno=True).syscall
    except (ImportError, OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    zero = ctypes.c_long(0)
    pid = syscall(ctypes.c_long(number), ctypes.c_ulong(CLONE_PARENT | signal.SIGCHLD), zero, zero, zero, zero)
    return pid if pid >= 0 else None


def _double_fork(argv: list, env: dict, log_path: str) -> int:
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
