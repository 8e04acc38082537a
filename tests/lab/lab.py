"""A fake Proxmox lab built from real parts: network namespaces with real OpenSSH servers, a `pct` stand-in
whose containers are PID + mount + UTS namespaces, and a fake nvidia-smi inside them.

    with Lab.start(tmp_path) as lab:
        lab.write_inventory(tmp_path / "inventory.yaml")
        subprocess.run([*lab.ssh_argv("pve1"), "/path/to/pct", "exec", "200", "--", "true"])

Everything the lab writes lives below `root`; Lab.stop() kills what it started (by pid), deletes its links
and namespaces, and is safe to call twice. Needs root, `ip`, `unshare`, `nsenter` and /usr/sbin/sshd.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import yaml

from tests.lab import lxclab, netns, sshd
from tests.lab.fake_nvidia_smi import DRIVER
from tests.lab.procs import ProcInfo, container_processes
from tests.polling import wait_for

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
CONTAINER_ENV = {
    "PATH": "/opt/lab/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "container": "lxc",
}
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", sshd.SSHD)
_lab_numbers = count()

__all__ = ["Lab", "LabHost", "LabContainer", "ProcInfo", "ContainerSpec", "HostSpec", "DEFAULT_SPEC",
           "lab_unavailable_reason", "seed_8gpu_state", "ct_config", "gpu_config_lines", "DRIVER"]
# the majors the lab hosts' NVIDIA drivers have in their /proc/devices (nvidia-uvm's is dynamic on a real host)
NVIDIA_MAJORS = {"nvidia-frontend": 195, "nvidia-uvm": 508, "nvidia-caps": 509}

GATE = "gate"   # the workspace folder workloads.GATED waits in (Lab.more_containers makes it)


def lab_unavailable_reason() -> str | None:
    """Why the lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the fake Proxmox lab needs root (network namespaces, unshare, nsenter)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the fake Proxmox lab needs {', '.join(missing)} (install iproute2, util-linux, openssh)"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount", "--uts", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"the fake Proxmox lab cannot create namespaces here: {probe.stderr.strip()}"
    return None


def seed_8gpu_state() -> list[dict]:
    """The 8 GPUs of the seed run while it was stalled: memory held, 0 % utilisation."""
    gpus = []
    for line in (FIXTURES / "seed_nvidia_smi_8gpu.csv").read_text().splitlines():
        index, used, util = (part.split()[0] for part in line.split(", "))
        gpus.append({"index": int(index), "memory.used": int(used), "utilization.gpu": int(util)})
    return gpus


def gpu_config_lines(gpus: int) -> list[str]:
    """What a CT config needs for `gpus` GPUs (docs/proxmox.md: preparing a GPU container)."""
    lines = [f"lxc.cgroup2.devices.allow: c {NVIDIA_MAJORS['nvidia-frontend']}:* rwm",
             f"lxc.cgroup2.devices.allow: c {NVIDIA_MAJORS['nvidia-uvm']}:* rwm"]
    for node in [*(f"nvidia{i}" for i in range(gpus)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        lines.append(f"lxc.mount.entry: /dev/{node} dev/{node} none bind,optional,create=file")
    return lines


def ct_config(ctid: int, gpus: int = 0, *, extra: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> str:
    """A CT config as Proxmox writes it: healthy GPU entries for `gpus`, `extra` lines added, lines containing
    any of `drop` left out."""
    lines = ["arch: amd64", f"hostname: ct{ctid}", "memory: 65536", "ostype: debian", "unprivileged: 1",
             *(gpu_config_lines(gpus) if gpus else []), *extra]
    return "".join(line + "\n" for line in lines if not any(part in line for part in drop))


@dataclass(frozen=True)
class ContainerSpec:
    ctid: int
    running: bool = True
    gpus: int | list[dict] = 0      # a count of idle H200s, or the fake nvidia-smi's GPU dicts
    config: str | None = None       # the CT config's text (default: ct_config(ctid, gpus))
    nvml: str | None = None         # the libnvidia-ml version installed (default: the host's driver, with GPUs)

    def gpu_states(self) -> list[dict]:
        return [{} for _ in range(self.gpus)] if isinstance(self.gpus, int) else list(self.gpus)


@dataclass(frozen=True)
class HostSpec:
    name: str
    containers: tuple[ContainerSpec, ...] = ()
    gpus: int | None = None         # the host's GPUs (default: as many as its biggest container has)
    driver: str | None = DRIVER     # its kernel module's version; None: no driver loaded
    attach_env: str = "keep"        # real LXC hosts (lxclab.py): `pct exec` as lxc-attach --keep-env or --clear-env
    max_sessions: int = 100         # its sshd's MaxSessions (OpenSSH's default is 10): channels per connection


DEFAULT_SPEC: tuple[HostSpec, ...] = (
    HostSpec("pve1", (ContainerSpec(200, gpus=seed_8gpu_state()), ContainerSpec(201, running=False))),
    HostSpec("pve2", (ContainerSpec(300, gpus=1),)),
)


@dataclass
class LabContainer:
    ctid: int
    gpus: int
    dir: Path                # <root>/hosts/<host>/ct/<ctid>
    workspace: Path          # host side of the container's /workspace
    lab_dir: Path            # host side of the container's /opt/lab
    gpu_state_file: Path     # host side of /opt/lab/gpus.json

    def init_pid(self) -> int | None:
        """Host pid of the container's PID 1 while it runs."""
        try:
            info = json.loads((self.dir / "init.json").read_text())
            stat = Path(f"/proc/{info['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError, KeyError):
            return None
        return info["pid"] if stat[0] not in "ZX" and int(stat[19]) == info["start_time"] else None


@dataclass
class LabHost:
    name: str
    netns: str
    address: str
    port: int
    pct_command: str
    host_key_pub_path: Path
    containers: dict[int, LabContainer]
    dir: Path
    link: netns.HostLink
    sshd_proc: subprocess.Popen[bytes] | None = None


@dataclass
class Lab:
    root: Path
    hosts: dict[str, LabHost]
    client_key: Path
    known_hosts: Path
    prefix: str
    lxc: bool = False               # hosts run real LXC containers (lxclab.py, pct_lxc.py), not the stand-in's
    session_cost: float = 0.0       # seconds of CPU work each SSH session's shell does before its command
    stopped: bool = False
    _drop_device: str | None = field(default=None, repr=False)
    _links: list[netns.HostLink] = field(default_factory=list, repr=False)
    _table: int | None = field(default=None, repr=False)

    # ---- life cycle ------------------------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, spec: tuple[HostSpec, ...] = DEFAULT_SPEC, *, lxc: bool = False,
              session_cost: float = 0.0) -> Lab:
        reason = lab_unavailable_reason()
        if reason:
            raise netns.LabSetupError(reason)
        root = Path(root).resolve()
        (root / "client").mkdir(parents=True, exist_ok=True)
        reap_stale_labs()
        lab = cls(root=root, hosts={}, client_key=root / "client" / "id_ed25519",
                  known_hosts=root / "client" / "known_hosts", lxc=lxc, session_cost=session_cost,
                  prefix=netns.device_prefix(os.getpid(), next(_lab_numbers)))
        atexit.register(lab.stop)
        try:
            lab._build(spec)
        except BaseException:
            lab.stop()
            raise
        return lab

    def _session_shell_rc(self) -> tuple[tuple[Path, str], ...]:
        """What bash reads when sshd starts a session (the login user's ~/.bashrc), replaced in the hosts' mount
        namespaces by one line giving the sessions this test process's PATH. The machine's own rc may run
        tools that lock files and wait a minute for a lock a killed session left behind (pyenv's rehash): no
        lab session may hang on that, and every session finds the same python as the tests."""
        rc = Path.home() / ".bashrc"
        if not rc.is_file():
            return ()
        replacement = self.root / "session-bashrc"
        replacement.write_text(f"export PATH={shlex.quote(os.environ.get('PATH', '/usr/bin:/bin'))}\n"
                               + (busy_loop(self.session_cost) if self.session_cost else ""))
        return ((replacement, str(rc)),)

    def _build(self, spec: tuple[HostSpec, ...]) -> None:
        if self.session_cost and not (Path.home() / ".bashrc").is_file():
            raise netns.LabSetupError("a per-session cost needs the login user's ~/.bashrc to stand in for")
        sshd.generate_key(self.client_key, "dflashctl-lab-client")
        shutil.copy(self.client_key.with_suffix(".pub"), self.root / "client" / "authorized_keys")
        links = self._create_links(spec)
        for host_spec in spec:
            self.hosts[host_spec.name] = self._create_host(host_spec, links[host_spec.name])
        shell_rc = self._session_shell_rc()
        for host in self.hosts.values():
            binds = ((host.dir / "proc" / "driver", "/proc/driver"), (host.dir / "proc" / "devices", "/proc/devices"),
                     *shell_rc)
            host.sshd_proc = sshd.start(host.netns, host.dir / "sshd_config", host.dir / "sshd.log", binds=binds)
        for host in self.hosts.values():
            sshd.wait_accepting(host.sshd_proc, host.address, host.port, host.dir / "sshd.log")
        self.known_hosts.write_text("".join(
            sshd.known_hosts_line(h.address, h.port, h.host_key_pub_path) for h in self.hosts.values()))
        for host_spec in spec:
            for ct in host_spec.containers:
                if ct.running:
                    self.pct(host_spec.name, "start", str(ct.ctid), check=True)

    def _create_links(self, spec: tuple[HostSpec, ...]) -> dict[str, netns.HostLink]:
        links: dict[str, netns.HostLink] = {}
        with netns.allocation_lock():
            netns.create_drop_device(self.prefix + "d")
            self._drop_device = self.prefix + "d"
            for number, host_spec in enumerate(spec):
                name = f"{netns.NETNS_PREFIX}{os.getpid()}-{self.prefix[-1]}-{host_spec.name}"
                links[host_spec.name] = netns.create_host_link(
                    name, f"{self.prefix}{number:x}r", f"{self.prefix}{number:x}c", self._drop_device)
                self._links.append(links[host_spec.name])
            self._table = netns.lab_table(self.prefix)
            netns.connect_hosts(self._links, self._table)
        return links

    def _create_host(self, spec: HostSpec, link: netns.HostLink) -> LabHost:
        host_dir = self.root / "hosts" / spec.name
        (host_dir / "bin").mkdir(parents=True, exist_ok=True)
        (host_dir / "lxc").mkdir(exist_ok=True)
        pct = host_dir / "bin" / "pct"
        if self.lxc:
            lxclab.install_pct(host_dir, pct, spec.attach_env)
        else:
            shutil.copy(HERE / "pct_standin.py", pct)
            pct.chmod(0o755)
        gpus = spec.gpus if spec.gpus is not None else max(
            [len(ct.gpu_states()) for ct in spec.containers] or [0])
        _create_host_driver(host_dir, gpus, spec.driver)
        host_key = sshd.generate_key(host_dir / "ssh_host_ed25519_key", f"lab-{spec.name}")
        sshd.write_config(host_dir / "sshd_config", address=link.address, port=22, host_key=host_key,
                          authorized_keys=self.root / "client" / "authorized_keys",
                          pid_file=host_dir / "sshd.pid", max_sessions=spec.max_sessions,
                          set_env={"LAB_ROOT": str(self.root), "LAB_HOST": spec.name})
        containers = {ct.ctid: self._create_container(host_dir, ct, spec.driver) for ct in spec.containers}
        return LabHost(name=spec.name, netns=link.netns, address=link.address, port=22,
                       pct_command=str(pct), host_key_pub_path=host_key.with_suffix(".pub"),
                       containers=containers, dir=host_dir, link=link)

    def _create_container(self, host_dir: Path, spec: ContainerSpec, driver: str | None) -> LabContainer:
        ct_dir = host_dir / "ct" / str(spec.ctid)
        gpus = len(spec.gpu_states())
        (host_dir / "lxc" / f"{spec.ctid}.conf").write_text(spec.config if spec.config is not None
                                                            else ct_config(spec.ctid, gpus))
        container = LabContainer(ctid=spec.ctid, gpus=gpus, dir=ct_dir,
                                 workspace=ct_dir / "workspace", lab_dir=ct_dir / "lab",
                                 gpu_state_file=ct_dir / "lab" / "gpus.json")
        container.workspace.mkdir(parents=True, exist_ok=True)
        (container.lab_dir / "bin").mkdir(parents=True, exist_ok=True)
        if self.lxc:
            lxclab.install_reaping_init(container.lab_dir)
        nvml = spec.nvml or (driver if gpus else None)
        if nvml:  # the user-space driver as NVIDIA's installer leaves it: the versioned file and its .so.1 link
            (ct_dir / "lib").mkdir(exist_ok=True)
            (ct_dir / "lib" / f"libnvidia-ml.so.{nvml}").write_bytes(b"\x7fELF")
            (ct_dir / "lib" / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{nvml}")
        if container.gpus:
            _install_nvidia_smi(container)
            _write_json_atomically(container.gpu_state_file, {"gpus": spec.gpu_states()})
        return container

    def add_container(self, host: str, spec: ContainerSpec) -> LabContainer:
        """A container made (and started, if spec.running) on a running lab; remove_container undoes it."""
        target = self.hosts[host]
        driver = _read_driver(target.dir)
        container = self._create_container(target.dir, spec, driver)
        target.containers[spec.ctid] = container
        if spec.running:
            self.pct(host, "start", str(spec.ctid), check=True)
        return container

    @contextlib.contextmanager
    def more_containers(self, boxes: tuple[tuple[str, int], ...], inventory: Path, *, gpus: int):
        """Containers (host, ctid) added for a while, each with `gpus` fake GPUs and a gate for workloads.GATED
        runs in its workspace; yields an inventory written at `inventory` that names them, and removes them at
        the end."""
        for host, ctid in boxes:
            self.add_container(host, ContainerSpec(ctid, gpus=gpus))
            (self.hosts[host].containers[ctid].workspace / GATE).mkdir()
        try:
            yield self.write_inventory(inventory)
        finally:
            for host, ctid in boxes:
                self.remove_container(host, ctid)

    def open_gate(self, host: str, ctid: int, run_id: str) -> None:
        """Let that container's workloads.GATED run `run_id` end."""
        (self.hosts[host].containers[ctid].workspace / GATE / run_id).touch()

    def remove_container(self, host: str, ctid: int) -> None:
        target = self.hosts[host]
        container = target.containers.pop(ctid)
        if self.lxc:
            lxclab.stop_containers(target.dir, target.pct_command, target.netns, [ctid])
        _kill_init(container)
        (target.dir / "lxc" / f"{ctid}.conf").unlink(missing_ok=True)
        shutil.rmtree(container.dir, ignore_errors=True)

    def set_host_driver(self, host: str, version: str | None) -> None:
        """The kernel module version the host's /proc/driver/nvidia/version shows (None: no module loaded)."""
        version_file = self.hosts[host].dir / "proc" / "driver" / "nvidia" / "version"
        if version is None:
            version_file.unlink(missing_ok=True)
        else:
            version_file.write_text(_module_version_text(version))

    def stop(self) -> None:
        """Kills the containers and sshds, removes links and namespaces. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        atexit.unregister(self.stop)
        for host in self.hosts.values():
            if self.lxc:
                lxclab.stop_containers(host.dir, host.pct_command, host.netns, list(host.containers))
            for container in host.containers.values():
                _kill_init(container)
            if host.sshd_proc is not None:
                sshd.stop(host.sshd_proc)
        if self._table is not None:
            netns.disconnect_hosts(self._links, self._table)
        for link in self._links:
            sshd.kill_pids(netns.netns_pids(link.netns))  # sessions and strays left in the namespace
            netns.remove_host_link(link)
        if self._drop_device:
            netns.remove_device(self._drop_device)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- what tests use --------------------------------------------------------------------------------

    def write_inventory(self, path: Path, *, extra_yaml: str = "") -> Path:
        """The inventory of DESIGN.md for this lab, laid out as DESIGN.md shows it (flow-style `defaults`
        and containers). `extra_yaml` is appended verbatim; `hosts` is the last top-level key, so text
        indented by two spaces adds hosts."""
        (self.root / "local-workdir").mkdir(exist_ok=True)
        lines = [f"defaults: {{user: root, port: 22, workdir: /workspace, python: {_yaml_str(sys.executable)}}}",
                 "hosts:"]
        for host in self.hosts.values():
            lines += [f"  {host.name}:", f"    address: {host.address}",
                      f"    identity_file: {_yaml_str(str(self.client_key))}",
                      f"    known_hosts: {_yaml_str(str(self.known_hosts))}",
                      f"    pct: {_yaml_str(host.pct_command)}", "    containers:" + ("" if host.containers else " {}")]
            lines += [f"      {ctid}: {{gpus: {ct.gpus}}}" for ctid, ct in host.containers.items()]
        lines += ["  local:", "    transport: local", f"    workdir: {_yaml_str(str(self.root / 'local-workdir'))}"]
        text = "\n".join(lines) + "\n" + extra_yaml + ("\n" if extra_yaml and not extra_yaml.endswith("\n") else "")
        path = Path(path)
        path.write_text(text)
        return path

    def ssh_argv(self, host: str, *, connect_timeout: float = 5) -> list[str]:
        """The OpenSSH client command for root on `host`, strict host key checking; append the remote
        command (already shell-quoted: the remote side runs it through root's shell)."""
        target = self.hosts[host]
        return ["ssh", "-i", str(self.client_key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR", "-F", "/dev/null",
                "-p", str(target.port), f"root@{target.address}"]

    def link_down(self, host: str) -> None:
        netns.set_link(self.hosts[host].link, up=False)

    def link_up(self, host: str) -> None:
        netns.set_link(self.hosts[host].link, up=True)

    def set_gpus(self, host: str, ctid: int, gpus: list[dict], *, processes: list[dict] | None = None,
                 timestamp: str | None = None) -> None:
        """Atomically replaces what the container's nvidia-smi reports (installing it if absent)."""
        container = self.hosts[host].containers[ctid]
        _install_nvidia_smi(container)
        state: dict = {"gpus": gpus, "processes": processes or []}
        if timestamp is not None:
            state["timestamp"] = timestamp
        _write_json_atomically(container.gpu_state_file, state)

    def clear_gpus(self, host: str, ctid: int) -> None:
        """Removes the state file: nvidia-smi then fails like a machine without a driver (exit 9)."""
        self.hosts[host].containers[ctid].gpu_state_file.unlink(missing_ok=True)

    def ct_run(self, host: str, ctid: int, argv: list[str], *, timeout: float = 10,
               input: bytes | str | None = None, text: bool = False) -> subprocess.CompletedProcess:
        """Runs argv inside the container directly (nsenter, no SSH, no pct), environment cleared as
        `pct exec` clears it, in the host's network namespace as the container's processes are; for
        assertions. Output is bytes unless text=True."""
        pid = self._running_init(host, ctid)
        return subprocess.run(
            self._nsenter(pid, argv),
            env=CONTAINER_ENV, capture_output=True, text=text, timeout=timeout, input=input,
            stdin=None if input is not None else subprocess.DEVNULL)

    def ct_start(self, host: str, ctid: int, argv: list[str], *, env: dict[str, str] | None = None,
                 **popen_kwargs) -> subprocess.Popen:
        """Starts argv in the container as ct_run runs it, without waiting (for processes that must run
        side by side, e.g. one torchrun per host); `env` is added to the cleared environment."""
        pid = self._running_init(host, ctid)
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(
            self._nsenter(pid, argv),
            env={**CONTAINER_ENV, **(env or {})}, **popen_kwargs)

    def _nsenter(self, pid: int, argv: list[str]) -> list[str]:
        """Into the container's namespaces; a real LXC container's user namespace too, so that what a test
        starts there belongs to the container's root, as what pct exec starts does."""
        return [shutil.which("nsenter") or "nsenter", "-t", str(pid), "-p", "-m", "-u", "-n",
                *(["-U"] if self.lxc else []), "--wd=/", "--", *argv]

    def ct_processes(self, host: str, ctid: int) -> list[ProcInfo]:
        return container_processes(self._running_init(host, ctid))

    def zombies(self, host: str, ctid: int) -> set[int]:
        return {p.pid for p in self.ct_processes(host, ctid) if p.state == "Z"}

    def lasting_zombies(self, host: str, ctid: int, *, besides: set[int] = frozenset(),
                        settle: float = 5.0) -> set[int]:
        """The container's zombies, `besides` aside, still there once their parents had `settle` seconds to reap
        them. One seen once may be a child whose parent (pct on the host, a supervisor) reaps it a moment later;
        under a PID 1 that never reaps, a leaked one stays."""
        wait_for(lambda: not self.zombies(host, ctid) - besides, settle, 0.1)
        return self.zombies(host, ctid) - besides

    def pct(self, host: str, *args: str, timeout: float = 30, check: bool = False,
            ) -> subprocess.CompletedProcess[str]:
        """Runs the host's pct stand-in directly, inside the host's namespace (no SSH)."""
        target = self.hosts[host]
        env = {"PATH": CONTAINER_ENV["PATH"], "LAB_ROOT": str(self.root), "LAB_HOST": host}
        proc = subprocess.run(["ip", "netns", "exec", target.netns, target.pct_command, *args], env=env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise netns.LabSetupError(f"pct {' '.join(args)} on {host}: exit {proc.returncode}: {proc.stderr}")
        return proc

    def _running_init(self, host: str, ctid: int) -> int:
        pid = self.hosts[host].containers[ctid].init_pid()
        if pid is None:
            raise netns.LabSetupError(f"CT {ctid} on {host} is not running")
        return pid


def _yaml_str(value: str) -> str:
    """A string as a YAML scalar: plain when that is unambiguous, else double-quoted (JSON is YAML)."""
    plain = re.fullmatch(r"[\w./+-][\w./+:-]*", value) and yaml.safe_load(value) == value
    return value if plain else json.dumps(value)


def _module_version_text(version: str) -> str:
    return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
            f"(dvs-builder@U22-I3-AF03-09-1)  Mon Oct 27 02:14:36 UTC 2026\nGCC version:  gcc version 12.2.0 "
            f"(Debian 12.2.0-14+deb12u1)\n")


def _read_driver(host_dir: Path) -> str | None:
    try:
        text = (host_dir / "proc" / "driver" / "nvidia" / "version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\S+)", text)
    return match.group(1) if match else None


def _create_host_driver(host_dir: Path, gpus: int, driver: str | None) -> None:
    """What a Proxmox host with the NVIDIA driver has: /proc/driver/nvidia/{version,gpus/}, the drivers' majors
    in /proc/devices, and /dev/nvidia* (here stand-ins with /dev/null's numbers, so that they open). The
    host's sshd sessions see the first two in place of the real /proc files."""
    driver_dir = host_dir / "proc" / "driver"
    (driver_dir / "nvidia" / "gpus").mkdir(parents=True, exist_ok=True)
    for index in range(gpus if driver else 0):
        (driver_dir / "nvidia" / "gpus" / f"0000:{0x18 + index:02x}:00.0").mkdir(exist_ok=True)
    if driver:
        (driver_dir / "nvidia" / "version").write_text(_module_version_text(driver))
    real = Path("/proc/devices").read_text()
    chars, _, blocks = real.partition("Block devices:")
    ours = "".join(f"{major:3d} {name}\n" for name, major in NVIDIA_MAJORS.items()) if driver else ""
    (host_dir / "proc" / "devices").write_text(chars.rstrip("\n") + "\n" + ours + "\nBlock devices:" + blocks)
    dev = host_dir / "dev"
    dev.mkdir(exist_ok=True)
    for node in ([*(f"nvidia{i}" for i in range(gpus)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
                 if driver and gpus else []):
        if not (dev / node).exists():
            os.mknod(dev / node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(dev / node, 0o666)  # as the driver makes them, past the umask: an unprivileged CT opens them


def _install_nvidia_smi(container: LabContainer) -> None:
    install_fake_nvidia_smi(container.lab_dir)


def install_fake_nvidia_smi(lab_dir: Path) -> Path:
    """The fake nvidia-smi as lab_dir/bin/nvidia-smi; its GPUs come from lab_dir/gpus.json. Returns lab_dir/bin."""
    binary = lab_dir / "bin" / "nvidia-smi"
    if not binary.exists():
        for sub in ("bin", "share"):
            (lab_dir / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "nvidia-smi" / "help_query_gpu.txt", lab_dir / "share")
        shutil.copy(HERE / "fake_nvidia_smi.py", binary)
        binary.chmod(0o755)
    return binary.parent


def _write_json_atomically(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def busy_loop(seconds: float) -> str:
    """A shell rc line that keeps a CPU busy for about `seconds` on an idle machine (a Proxmox host's login
    shell doing its rc's work: a fixed amount of work, so it takes longer on a loaded machine, as real work
    does): a count calibrated here against bash itself."""
    probe = 200_000
    took = min(_timed(["bash", "-c", f"i=0; while [ $i -lt {probe} ]; do i=$((i+1)); done"]) for _ in range(3))
    return f"i=0; while [ $i -lt {max(1, int(probe * seconds / took))} ]; do i=$((i+1)); done\n"


def _timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True)
    return time.monotonic() - started


def _kill_init(container: LabContainer) -> None:
    pid = container.init_pid()
    if pid is None:
        return
    os.kill(pid, signal.SIGKILL)  # PID 1 of a pid namespace takes everything inside with it
    deadline = time.monotonic() + 5
    while container.init_pid() == pid and time.monotonic() < deadline:
        time.sleep(0.01)
    (container.dir / "init.json").unlink(missing_ok=True)


def reap_stale_labs() -> None:
    """Removes what labs of test processes that no longer exist left behind (e.g. after SIGKILL)."""
    for name in netns.stale_lab_namespaces():
        sshd.kill_pids(netns.netns_pids(name))
        netns.ip("netns", "del", name, check=False)
    for device in netns.stale_lab_devices():
        netns.remove_device(device)
    for table in netns.stale_lab_tables():
        netns.remove_rules_of_table(table)
        netns.ip("route", "flush", "table", str(table), check=False)
