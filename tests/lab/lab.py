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
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import yaml

from tests.lab import netns, sshd
from tests.lab.procs import ProcInfo, container_processes

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
           "lab_unavailable_reason", "seed_8gpu_state"]


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


@dataclass(frozen=True)
class ContainerSpec:
    ctid: int
    running: bool = True
    gpus: int | list[dict] = 0      # a count of idle H200s, or the fake nvidia-smi's GPU dicts

    def gpu_states(self) -> list[dict]:
        return [{} for _ in range(self.gpus)] if isinstance(self.gpus, int) else list(self.gpus)


@dataclass(frozen=True)
class HostSpec:
    name: str
    containers: tuple[ContainerSpec, ...] = ()


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
    stopped: bool = False
    _drop_device: str | None = field(default=None, repr=False)
    _links: list[netns.HostLink] = field(default_factory=list, repr=False)
    _table: int | None = field(default=None, repr=False)

    # ---- life cycle ------------------------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, spec: tuple[HostSpec, ...] = DEFAULT_SPEC) -> Lab:
        reason = lab_unavailable_reason()
        if reason:
            raise netns.LabSetupError(reason)
        root = Path(root).resolve()
        (root / "client").mkdir(parents=True, exist_ok=True)
        reap_stale_labs()
        lab = cls(root=root, hosts={}, client_key=root / "client" / "id_ed25519",
                  known_hosts=root / "client" / "known_hosts",
                  prefix=netns.device_prefix(os.getpid(), next(_lab_numbers)))
        atexit.register(lab.stop)
        try:
            lab._build(spec)
        except BaseException:
            lab.stop()
            raise
        return lab

    def _build(self, spec: tuple[HostSpec, ...]) -> None:
        sshd.generate_key(self.client_key, "dflashctl-lab-client")
        shutil.copy(self.client_key.with_suffix(".pub"), self.root / "client" / "authorized_keys")
        links = self._create_links(spec)
        for host_spec in spec:
            self.hosts[host_spec.name] = self._create_host(host_spec, links[host_spec.name])
        for host in self.hosts.values():
            host.sshd_proc = sshd.start(host.netns, host.dir / "sshd_config", host.dir / "sshd.log")
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
        shutil.copy(HERE / "pct_standin.py", pct)
        pct.chmod(0o755)
        host_key = sshd.generate_key(host_dir / "ssh_host_ed25519_key", f"lab-{spec.name}")
        sshd.write_config(host_dir / "sshd_config", address=link.address, port=22, host_key=host_key,
                          authorized_keys=self.root / "client" / "authorized_keys",
                          pid_file=host_dir / "sshd.pid",
                          set_env={"LAB_ROOT": str(self.root), "LAB_HOST": spec.name})
        containers = {ct.ctid: self._create_container(host_dir, ct) for ct in spec.containers}
        return LabHost(name=spec.name, netns=link.netns, address=link.address, port=22,
                       pct_command=str(pct), host_key_pub_path=host_key.with_suffix(".pub"),
                       containers=containers, dir=host_dir, link=link)

    def _create_container(self, host_dir: Path, spec: ContainerSpec) -> LabContainer:
        ct_dir = host_dir / "ct" / str(spec.ctid)
        (host_dir / "lxc" / f"{spec.ctid}.conf").write_text(
            f"arch: amd64\nhostname: ct{spec.ctid}\nostype: debian\nunprivileged: 1\n")
        container = LabContainer(ctid=spec.ctid, gpus=len(spec.gpu_states()), dir=ct_dir,
                                 workspace=ct_dir / "workspace", lab_dir=ct_dir / "lab",
                                 gpu_state_file=ct_dir / "lab" / "gpus.json")
        container.workspace.mkdir(parents=True, exist_ok=True)
        (container.lab_dir / "bin").mkdir(parents=True, exist_ok=True)
        if container.gpus:
            _install_nvidia_smi(container)
            _write_json_atomically(container.gpu_state_file, {"gpus": spec.gpu_states()})
        return container

    def stop(self) -> None:
        """Kills the containers and sshds, removes links and namespaces. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        atexit.unregister(self.stop)
        for host in self.hosts.values():
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
            [shutil.which("nsenter") or "nsenter", "-t", str(pid), "-p", "-m", "-u", "-n", "--wd=/", "--", *argv],
            env=CONTAINER_ENV, capture_output=True, text=text, timeout=timeout, input=input,
            stdin=None if input is not None else subprocess.DEVNULL)

    def ct_start(self, host: str, ctid: int, argv: list[str], *, env: dict[str, str] | None = None,
                 **popen_kwargs) -> subprocess.Popen:
        """Starts argv in the container as ct_run runs it, without waiting (for processes that must run
        side by side, e.g. one torchrun per host); `env` is added to the cleared environment."""
        pid = self._running_init(host, ctid)
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(
            [shutil.which("nsenter") or "nsenter", "-t", str(pid), "-p", "-m", "-u", "-n", "--wd=/", "--", *argv],
            env={**CONTAINER_ENV, **(env or {})}, **popen_kwargs)

    def ct_processes(self, host: str, ctid: int) -> list[ProcInfo]:
        return container_processes(self._running_init(host, ctid))

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
