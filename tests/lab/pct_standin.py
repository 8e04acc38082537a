#!/usr/bin/python3
"""Stand-in for Proxmox VE's `pct` on a fake lab host (installed as <lab>/hosts/<host>/bin/pct).

A container is a PID + mount + UTS namespace made by `unshare`. Its PID 1 is `sleep infinity`, which never
calls wait(), so orphans that exit stay zombies until the container stops, as in the seed run. Its mount
namespace has the container's persistent directory on /workspace (or, for `mp0: ...,mp=/workspace,size=S`, an
ext4 image of that size, loop-mounted), a fresh tmpfs on /dev/shm (lost on stop and reboot; sized by an
`lxc.mount.entry: tmpfs dev/shm tmpfs size=...` line) and its lab directory on /opt/lab (bin/nvidia-smi,
gpus.json). It sees the host's /proc/driver (the NVIDIA kernel module's version), its <ct>/lib laid over the
system library directory (libnvidia-ml.so.<version>), and the host's /dev with the CT config's GPU nodes on
top: a bound node whose host node exists is there, one whose host node is missing is an empty file
(`create=file`), and one whose major no devices.allow rule allows does not open. `cores: N` limits every
process of the container to N CPUs. The init's host pid and start time are kept in
<lab>/hosts/<host>/ct/<id>/init.json while it runs.

`pct exec CTID [--] CMD [ARG...]` behaves like `lxc-attach --clear-env`, bad habits included:
  - CMD is exec'd directly (no shell, argv untouched) in the container's pid, mount and UTS namespaces, cwd /,
    with stdin/stdout/stderr inherited and this environment only:
        PATH=/opt/lab/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        HOME=/root
        container=lxc
    (no TERM, no LANG, nothing of the caller's environment);
  - CMD stays in pct's process group and session (outside the container, so it sees 0 for both); when CMD
    returns, pct returns at once and nothing is killed: a background child survives, reparented to PID 1;
  - anything that still holds the inherited stdout/stderr keeps the caller's SSH session open;
  - SIGHUP, SIGTERM or SIGINT to pct end pct alone (it dies of the signal); CMD goes on running.
  As real lxc-attach does without a terminal (tests/on_lab/test_lab_lxc.py runs the same tests on it).
Each `pct exec` adds a line to <lab>/hosts/<host>/ct/<id>/exec.log (its arguments, cut short), before it attaches.
A test knob: while <lab>/hosts/<host>/ct/<id>/exec-hangs exists, `pct exec` on that container hangs before it
attaches, as lxc-attach does on a frozen container, until a signal ends it; only for commands with an argument
equal to the file's first line when it has one (`ps`: only the agent's ps hangs). Another: a file exec-fails
there makes the next `pct exec` (with an argument equal to its first line, when it has one) fail once, as an
attach that failed: it removes the file, says why on stderr and exits 1 without running anything.

Exit codes: `exec` returns CMD's exit code, 128+N if CMD died of signal N (pct itself dies of a signal it gets), 127 if CMD was not found, 126 if
it could not be executed. Every error of pct itself exits 2: unknown CT (Proxmox's "Configuration file
'nodes/<host>/lxc/<id>.conf' does not exist"), `CT <id> not running`, `CT <id> already running`, bad usage,
a file push/pull could not copy.

Which host and lab this is comes from LAB_ROOT and LAB_HOST (set by the host's sshd), else from where this
file is installed.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CONTAINER_ENV = {
    "PATH": "/opt/lab/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "container": "lxc",
}
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID = 0x00020000, 0x04000000, 0x20000000
MS_BIND, MS_REC, MS_REMOUNT, MS_NODEV = 4096, 16384, 32, 4
USAGE = """USAGE: pct <COMMAND> [ARGS] [OPTIONS]
       pct list
       pct status <vmid>
       pct start <vmid>
       pct stop <vmid>
       pct reboot <vmid>
       pct exec <vmid> [--] <command> [<args>...]
       pct push <vmid> <file> <destination> [--perms <octal>]
       pct pull <vmid> <path> <destination>
       pct config <vmid>
       pct help
"""


class PctError(Exception):
    """An error of pct itself: message on stderr, exit 2."""


def host_dirs() -> tuple[Path, str]:
    if os.environ.get("LAB_ROOT") and os.environ.get("LAB_HOST"):
        return Path(os.environ["LAB_ROOT"]), os.environ["LAB_HOST"]
    host_dir = Path(__file__).resolve().parent.parent
    return host_dir.parent.parent, host_dir.name


class Container:
    def __init__(self, ctid_text: str) -> None:
        if not ctid_text.isdigit():
            raise PctError(f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{ctid_text}'")
        self.ctid = int(ctid_text)
        root, host = host_dirs()
        self.conf = root / "hosts" / host / "lxc" / f"{self.ctid}.conf"
        self.dir = root / "hosts" / host / "ct" / str(self.ctid)
        self.init_file = self.dir / "init.json"
        if not self.conf.is_file():
            raise PctError(f"Configuration file 'nodes/{host}/lxc/{self.ctid}.conf' does not exist")

    def entries(self) -> list[tuple[str, str]]:
        """Every `key: value` line in order (lxc.* keys repeat)."""
        pairs = (line.split(":", 1) for line in self.conf.read_text().splitlines() if ":" in line)
        return [(key.strip(), value.strip()) for key, value in pairs if not key.lstrip().startswith("#")]

    def config(self) -> dict[str, str]:
        return dict(self.entries())

    def init_pid(self) -> int | None:
        try:
            info = json.loads(self.init_file.read_text())
        except (OSError, ValueError):
            return None
        return info["pid"] if process_start_time(info["pid"]) == info["start_time"] else None

    def running_pid(self) -> int:
        pid = self.init_pid()
        if pid is None:
            raise PctError(f"CT {self.ctid} not running")
        return pid


def process_start_time(pid: int) -> int | None:
    """Start time in clock ticks, or None for a pid that is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else int(fields[19])


# ---- exec ---------------------------------------------------------------------------------------------

def enter_namespaces(init_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fds = [(os.open(f"/proc/{init_pid}/ns/{name}", os.O_RDONLY), flag)
               for name, flag in (("uts", CLONE_NEWUTS), ("pid", CLONE_NEWPID), ("mnt", CLONE_NEWNS))]
    except FileNotFoundError:
        raise PctError("container stopped while attaching") from None
    for fd, flag in fds:
        if libc.setns(fd, flag) != 0:
            raise PctError(f"setns failed: {os.strerror(ctypes.get_errno())}")
        os.close(fd)


def exec_child(argv: list[str]) -> None:
    """In the forked child: exec CMD; never returns."""
    code = 126
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, *STOP_SIGNALS):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE; an exec'd CMD must not
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.chdir("/")
        os.execvpe(argv[0], argv, CONTAINER_ENV)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        os.write(2, f'lxc-attach: Failed to exec "{argv[0]}": {exc.strerror}\n'.encode())
    finally:
        os._exit(code)


def hang_if_told(container: Container, argv: list[str]) -> None:
    """The exec-hangs knob (see the module docstring): sleep until a signal (default action: end) ends pct."""
    try:
        only = (container.dir / "exec-hangs").read_text().strip()
    except FileNotFoundError:
        return
    if not only or only in argv:
        while True:
            signal.pause()


def fail_once_if_told(container: Container, argv: list[str]) -> None:
    """The exec-fails knob (see the module docstring): the first matching `pct exec` fails and removes it."""
    knob = container.dir / "exec-fails"
    try:
        only = knob.read_text().strip()
    except FileNotFoundError:
        return
    if only and only not in argv:
        return
    try:
        knob.unlink()
    except FileNotFoundError:
        return  # another pct exec took this failure
    sys.stderr.write("lxc-attach: failed to attach to the container (exec-fails)\n")
    sys.exit(1)


def note_exec(container: Container, argv: list[str]) -> None:
    """One line per `pct exec` in the container's exec.log (its arguments, each cut to 40 characters): what
    tests count commands per target by."""
    with open(container.dir / "exec.log", "a", encoding="utf-8") as log:
        log.write(json.dumps([arg[:40] for arg in argv]) + "\n")


def cmd_exec(args: list[str]) -> int:
    if not args:
        raise PctError("400 not enough arguments\n" + USAGE)
    container = Container(args[0])
    argv = args[2:] if args[1:2] == ["--"] else args[1:]
    if not argv:
        raise PctError("missing command")
    note_exec(container, argv)
    fail_once_if_told(container, argv)
    hang_if_told(container, argv)
    enter_namespaces(container.running_pid())
    limit_cpus(container)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)  # pct dies of them, as lxc-attach does; CMD is not told
    child = os.fork()
    if child == 0:
        exec_child(argv)
    _, status = os.waitpid(child, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


# ---- lifecycle ------------------------------------------------------------------------------------------

def libc_mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    enc = (lambda s: s.encode() if s is not None else None)
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source} on {target}: {os.strerror(ctypes.get_errno())}")


def container_init(ctid_text: str) -> None:
    """Runs as the new namespaces' PID 1: set up the mounts, record itself, become a non-reaping init."""
    container = Container(ctid_text)
    host_pid = int(os.readlink("/proc/self"))  # still the host's /proc: our pid as the host sees it
    start_time = process_start_time(host_pid)
    libc_mount("proc", "/proc", "proc", 0)
    root, host = host_dirs()
    if (root / "hosts" / host / "proc" / "driver").is_dir():  # procfs shows a container the host's driver
        libc_mount(str(root / "hosts" / host / "proc" / "driver"), "/proc/driver", None, MS_BIND)
    socket.sethostname(container.config().get("hostname", f"ct{container.ctid}"))
    for path in ("/workspace", "/opt/lab"):
        os.makedirs(path, exist_ok=True)
    mount_workspace(container)
    libc_mount(str(container.dir / "lab"), "/opt/lab", None, MS_BIND | MS_REC)
    mount_devices(container)
    libc_mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777" + shm_size(container))
    if os.path.isdir("/run/systemd"):  # the host's systemd is not the container's PID 1: the agent must not see it
        libc_mount("tmpfs", "/run/systemd", "tmpfs", 0, "mode=755")  # (nor write its boot unit into the host's /etc)
    mount_nvidia_libraries(container)
    limit_cpus(container)
    tmp = container.init_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": host_pid, "start_time": start_time}))
    os.replace(tmp, container.init_file)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir("/")
    os.execvpe("sleep", ["sleep", "infinity"], {"PATH": CONTAINER_ENV["PATH"], "container": "lxc"})


def mount_workspace(container: Container) -> None:
    """/workspace: the container's directory, or a disk of its own (`mp0: ...,mp=/workspace,size=128M`): an
    ext4 image made on first start, loop-mounted."""
    for key, value in container.entries():
        options = dict(part.partition("=")[::2] for part in value.split(",")[1:])
        if key.startswith("mp") and options.get("mp") == "/workspace" and options.get("size"):
            image = container.dir / f"{key}.raw"
            if not image.exists():
                subprocess.run(["truncate", "-s", options["size"], str(image)], check=True)
                subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["mount", "-o", "loop", str(image), "/workspace"], check=True)
            return
    libc_mount(str(container.dir / "workspace"), "/workspace", None, MS_BIND | MS_REC)


def host_majors() -> dict[str, int]:
    """The lab host's /proc/devices (its NVIDIA majors included): driver name -> major."""
    root, host = host_dirs()
    majors = {}
    try:
        text = (root / "hosts" / host / "proc" / "devices").read_text()
    except FileNotFoundError:
        return majors
    for line in text.split("Block devices:")[0].splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit():
            majors[fields[1]] = int(fields[0])
    return majors


def allowed(rules: list[str], major: int | None) -> bool:
    for rule in rules:
        parts = rule.split()
        if parts[:1] == ["a"] or (len(parts) >= 2 and parts[0] in ("c", "a")
                                  and parts[1].split(":")[0] in ("*", str(major))):
            return True
    return False


def device_entries(container: Container) -> list[tuple[str, str, bool]]:
    """(node, host source, create=file) of every /dev node the CT config binds in or passes through (devN:)."""
    found = []
    for key, value in container.entries():
        fields = value.split()
        if key == "lxc.mount.entry" and len(fields) >= 4 and fields[0].startswith("/dev/"):
            found.append(("/" + fields[1].strip("/"), fields[0], "create=file" in fields[3]))
        elif key[:3] == "dev" and key[3:].isdigit():
            node = value.split(",")[0].strip()
            found.append((node, node, False))
    return found


def mount_devices(container: Container) -> None:
    """LXC's habits with GPU nodes: a bind entry whose host node exists gives the node; one whose host node is
    missing leaves an empty file (`optional,create=file`); a node whose major no devices.allow rule (or devN:
    entry) allows is there but does not open. /dev becomes the host's /dev with these nodes laid over it."""
    entries = device_entries(container)
    if not entries:
        return
    root, host = host_dirs()
    layer = container.dir / "dev"
    subprocess.run(["rm", "-rf", str(layer)], check=True)
    layer.mkdir()
    rules = [v for k, v in container.entries() if k in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")]
    passed = {node for key, value in container.entries() if key[:3] == "dev" and key[3:].isdigit()
              for node in [value.split(",")[0].strip()]}
    majors, denied = host_majors(), []
    for node, source, create_file in entries:
        host_node = root / "hosts" / host / source.lstrip("/")
        target = layer / node[len("/dev/"):]
        if host_node.exists():
            os.mknod(target, 0o666 | (os.stat(host_node).st_mode & 0o170000), os.stat(host_node).st_rdev)
            major = majors.get("nvidia-uvm" if "uvm" in node else "nvidia-frontend")
            if node not in passed and not allowed(rules, major):
                denied.append(node)
        elif create_file:
            target.touch()
    libc_mount("overlay", "/dev", "overlay", 0, f"lowerdir={layer}:/dev")
    for node in denied:  # what the cgroup's device rules do to open(): refuse (here EACCES, there EPERM)
        libc_mount(node, node, None, MS_BIND)
        libc_mount(node, node, None, MS_BIND | MS_REMOUNT | MS_NODEV)
    try:
        libc_mount("devpts", "/dev/pts", "devpts", 0, "newinstance,ptmxmode=0666")
    except OSError:
        pass


def shm_size(container: Container) -> str:
    """`lxc.mount.entry: tmpfs dev/shm tmpfs size=16G,...`: the size given to /dev/shm."""
    for key, value in container.entries():
        fields = value.split()
        if key == "lxc.mount.entry" and len(fields) >= 4 and fields[1].strip("/") == "dev/shm":
            sizes = [o for o in fields[3].split(",") if o.startswith("size=")]
            return "," + sizes[0] if sizes else ""
    return ""


def mount_nvidia_libraries(container: Container) -> None:
    """The container's NVIDIA user-space libraries (<ct>/lib: libnvidia-ml.so.<version>) laid over the system
    library directory, where a driver installed with --no-kernel-module puts them."""
    libs = container.dir / "lib"
    system = next((d for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu") if os.path.isdir(d)), None)
    if system and libs.is_dir() and any(libs.iterdir()):
        libc_mount("overlay", system, "overlay", 0, f"lowerdir={libs}:{system}")


def limit_cpus(container: Container) -> None:
    """`cores: N`: the container's processes run on N of the host's CPUs (Proxmox uses a cpuset)."""
    cores = container.config().get("cores", "")
    if cores.isdigit():
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:max(int(cores), 1)])


def cmd_start(args: list[str]) -> int:
    container = Container(args[0])
    if container.init_pid() is not None:
        raise PctError(f"CT {container.ctid} already running")
    container.init_file.unlink(missing_ok=True)
    with open(container.dir / "console.log", "ab") as console:
        starter = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--uts", "--propagation", "private", "--",
             sys.executable, "-S", os.path.abspath(__file__), "__init", str(container.ctid)],
            stdin=subprocess.DEVNULL, stdout=console, stderr=console, start_new_session=True,
        )
    deadline = time.monotonic() + 10
    while container.init_pid() is None:
        if starter.poll() is not None or time.monotonic() > deadline:
            raise PctError(f"CT {container.ctid} failed to start (see {container.dir / 'console.log'})")
        time.sleep(0.005)
    return 0


def cmd_stop(args: list[str]) -> int:
    container = Container(args[0])
    pid = container.running_pid()
    start_time = process_start_time(pid)
    os.kill(pid, signal.SIGKILL)  # PID 1 of a pid namespace dying takes every process inside with it
    deadline = time.monotonic() + 10
    while process_start_time(pid) == start_time and time.monotonic() < deadline:
        time.sleep(0.005)
    container.init_file.unlink(missing_ok=True)
    return 0


def cmd_reboot(args: list[str]) -> int:
    cmd_stop(args)
    return cmd_start(args)


# ---- queries and files ----------------------------------------------------------------------------------

def cmd_list(_args: list[str]) -> int:
    root, host = host_dirs()
    confs = sorted((root / "hosts" / host / "lxc").glob("*.conf"), key=lambda p: int(p.stem))
    print("%-10s %-10s %-12s %-20s" % ("VMID", "Status", "Lock", "Name"))
    for conf in confs:
        container = Container(conf.stem)
        status = "running" if container.init_pid() is not None else "stopped"
        print("%-10s %-10s %-12s %-20s" % (container.ctid, status, "", container.config().get("hostname", "")))
    return 0


def cmd_status(args: list[str]) -> int:
    container = Container(args[0])
    print("status: " + ("running" if container.init_pid() is not None else "stopped"))
    return 0


def cmd_config(args: list[str]) -> int:
    sys.stdout.write(Container(args[0]).conf.read_text())
    return 0


def copy_file(src: str, dst: str, perms: int | None) -> None:
    try:
        data = Path(src).read_bytes()
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if perms is None else perms)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if perms is not None:
                os.fchmod(out.fileno(), perms)
    except OSError as exc:
        raise PctError(f"failed to copy '{src}' to '{dst}': {exc.strerror}") from None


def cmd_push(args: list[str]) -> int:
    perms = None
    if "--perms" in args:
        at = args.index("--perms")
        perms, args = int(args[at + 1], 8), args[:at] + args[at + 2:]
    if len(args) != 3:
        raise PctError("400 wrong number of arguments\n" + USAGE)
    root = f"/proc/{Container(args[0]).running_pid()}/root"
    copy_file(args[1], root + os.path.join("/", args[2]), perms)
    return 0


def cmd_pull(args: list[str]) -> int:
    if len(args) != 3:
        raise PctError("400 wrong number of arguments\n" + USAGE)
    root = f"/proc/{Container(args[0]).running_pid()}/root"
    copy_file(root + os.path.join("/", args[1]), args[2], None)
    return 0


def cmd_help(_args: list[str]) -> int:
    sys.stdout.write(USAGE)
    return 0


COMMANDS = {
    "exec": cmd_exec, "list": cmd_list, "status": cmd_status, "start": cmd_start, "stop": cmd_stop,
    "reboot": cmd_reboot, "push": cmd_push, "pull": cmd_pull, "config": cmd_config, "help": cmd_help,
}
NEEDS_CTID = {"exec", "status", "start", "stop", "reboot", "push", "pull", "config"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["__init"]:
        container_init(argv[1])
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(("unknown command 'pct %s'\n" % argv[0] if argv else "") + USAGE)
        return 2
    try:
        if argv[0] in NEEDS_CTID and len(argv) < 2:
            raise PctError("400 not enough arguments\n" + USAGE)
        return COMMANDS[argv[0]](argv[1:])
    except PctError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
