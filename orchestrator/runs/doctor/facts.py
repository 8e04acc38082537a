"""What the checks judge, gathered in two round trips: one fixed script on the host, one agent `probe` in the
container (dflash_agent/probe.py), plus what a trainer config asks for (Needs).

On the host: the kernel module's version (/proc/driver/nvidia/version), its GPUs (/proc/driver/nvidia/gpus/),
the majors of the NVIDIA character devices (/proc/devices), the host's CPUs and memory, and for a container
`pct config CTID`. A plain SSH host or `local` is its own host.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dflash_records.gpu import GpuRow
from dflash_records.plans import ProbeFacts
from dflash_records.protocol import KIB, ascii_decimal

from ...errors import DflashError
from ...inventory.model import Target
from ...transports.base import Transport
from ...transports.pct import PctTransport
from ...transports.timeouts import PROBE_TIMEOUT_S
from ..client import RunClient
from ..command import config_base_dir
from ..spec import runs_dir
from ..trainerconfig import config_defaults, config_file, config_path
from .pctconfig import CtConfig, parse_ct_config

# "$@", when given, is `pct config CTID` (pct as the inventory spells it): one round trip for everything
HOST_SCRIPT = ("cat /proc/driver/nvidia/version 2>/dev/null; echo '--- gpus'; ls /proc/driver/nvidia/gpus 2>/dev/null;"
               " echo '--- devices'; cat /proc/devices; echo '--- cpus'; nproc;"
               " echo '--- meminfo'; grep MemTotal /proc/meminfo;"
               ' if [ $# -gt 0 ]; then echo "--- pct"; "$@" 2>&1 || echo "--- pct failed: exit $?"; fi; true')
MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


@dataclass
class HostFacts:
    module_version: str | None = None
    gpus: int = 0                              # entries of /proc/driver/nvidia/gpus
    majors: dict[str, int] = field(default_factory=dict)  # nvidia-frontend -> 195, nvidia-uvm -> 508, ...
    cpus: int | None = None
    mem_bytes: int | None = None
    ct: CtConfig | None = None                 # None for a target without a container
    error: str | None = None                   # why something of the above could not be read


@dataclass(frozen=True)
class Needs:
    """What a trainer config asks of a target (defaults as the trainer's own)."""
    source: str
    paths: dict[str, str]                      # config key -> path (target_path, data_path, output_dir)
    keep_checkpoints: int
    checkpoint_every: int
    max_steps: int
    num_workers: int
    drafter_layers: int
    cpu_only: bool
    text: bytes = b""                          # the file as read, for the trainer's own check on the target


@dataclass
class Facts:
    target: Target
    host: HostFacts
    probe: ProbeFacts
    expected_gpus: int
    needs: Needs | None = None
    smi_gpus: list[GpuRow] | None = None       # nvidia-smi's rows, None where it did not answer
    probe_error: str | None = None             # why the agent's probe did not run (then `probe` is empty)

    @property
    def paths(self) -> dict[str, str]:
        """The config's paths on this target, as its trainer check places them (resolved_paths)."""
        return resolved_paths(self.needs, self.target)

    @property
    def nproc(self) -> int:
        """Processes a run starts on this target: one per GPU, one where it runs on the CPU."""
        return 1 if self.needs is not None and self.needs.cpu_only else max(self.expected_gpus, 1)


def resolved_paths(needs: Needs | None, target: Target) -> dict[str, str]:
    """The config's paths where the trainer's check on `target` takes them: relative ones from the launch's base
    directory (command.config_base_dir: on `local` the config file's), by the trainer's own rule. A `~` path on
    another machine is left to that check: whose home it names is known only there."""
    if needs is None:
        return {}
    base, here = config_base_dir(target, needs.source), target.host.transport == "local"
    return {key: config_path(base, path) for key, path in needs.paths.items() if here or not path.startswith("~")}


def read_needs(config: Path) -> Needs:
    """The config's paths and sizes; a file that is not a YAML mapping is a usage error (exit 2)."""
    text, data = config_file(config)
    defaults = config_defaults()

    def get(key: str, kind: type = int):
        value = data.get(key, defaults.get(key))
        try:
            return kind(value)
        except (TypeError, ValueError):
            return kind(defaults.get(key) or 0)

    paths = {key: str(data[key]) for key in ("target_path", "data_path", "output_dir") if data.get(key)}
    return Needs(source=str(config), paths=paths, keep_checkpoints=get("keep_checkpoints"),
                 checkpoint_every=get("checkpoint_every"), max_steps=get("max_steps"),
                 num_workers=get("num_workers"), drafter_layers=get("drafter_layers"),
                 cpu_only=str(data.get("device", "")).lower() == "cpu", text=text)


def host_facts(host: Transport, target: Target) -> HostFacts:
    facts = HostFacts()
    pct = [*PctTransport(host, target.ctid, pct_command=target.host.pct).pct, "config", str(target.ctid)] \
        if target.ctid is not None else []
    result = host.run(["sh", "-c", HOST_SCRIPT, "sh", *pct], timeout=PROBE_TIMEOUT_S)
    if not result.ok:
        facts.error = f"cannot read the host's driver files: {result.describe()}"
        return facts
    text, _, config = result.out.partition("\n--- pct\n")
    _parse_host_script(text, facts)
    if target.ctid is not None:
        body, failed, status = config.partition("--- pct failed: ")
        if failed:
            facts.error = f"`{target.host.pct} config {target.ctid}` failed ({status.strip()}): {body.strip()[-200:]}"
        else:
            facts.ct = parse_ct_config(body)
    return facts


def _parse_host_script(text: str, facts: HostFacts) -> None:
    sections = re.split(r"^--- (\w+)$", text, flags=re.MULTILINE)
    match = MODULE_VERSION.search(sections[0])
    facts.module_version = match.group(1) if match else None
    parts = dict(zip(sections[1::2], sections[2::2]))
    facts.gpus = len(parts.get("gpus", "").split())
    char_devices = parts.get("devices", "").split("Block devices:")[0]
    for line in char_devices.splitlines():
        fields = line.split()
        major = ascii_decimal(fields[0]) if len(fields) == 2 else None
        if major is not None and fields[1].startswith("nvidia"):
            facts.majors[fields[1]] = major
    facts.cpus = ascii_decimal(parts.get("cpus", "").strip())
    mem = parts.get("meminfo", "").split()
    mem_kib = ascii_decimal(mem[1]) if len(mem) >= 2 else None
    facts.mem_bytes = mem_kib * KIB if mem_kib is not None else None


def expected_nodes(gpus: int) -> list[str]:
    """The device nodes CUDA opens: the control node, unified memory and one per GPU."""
    return ["/dev/nvidiactl", "/dev/nvidia-uvm", *(f"/dev/nvidia{i}" for i in range(gpus))]


def container_probe(client: RunClient, target: Target, gpus: int,
                    needs: Needs | None) -> tuple[ProbeFacts, str | None]:
    """The agent's probe in the container, and why it could not run there (None when it did)."""
    args = ["--workdir", target.workdir, "--runs-dir", runs_dir(target)]
    for node in expected_nodes(gpus):
        args += ["--node", node]
    paths = resolved_paths(needs, target)
    for path in paths.values():
        args += ["--path", path]
    if "target_path" in paths:
        args += ["--model", paths["target_path"]]
    try:
        answer = client.probe(target, args)
    except DflashError as exc:
        return ProbeFacts(), str(exc)
    return (answer.probe, None) if answer.ok else (ProbeFacts(), str(answer.error))


def gather(client: RunClient, target: Target, *, smi_gpus: list[GpuRow] | None, needs: Needs | None,
           with_host: bool = True) -> Facts:
    """Facts for the checks; without the host's (a CPU run's launch needs none of them) one round trip."""
    host = host_facts(client.conns.host_transport(target.host), target) if with_host else HostFacts()
    expected = target.gpus or len(smi_gpus or ()) or (host.gpus if target.ctid is None else 0)
    if not expected and target.ctid is not None and host.ct is not None and host.gpus:
        expected = sum(1 for i in range(host.gpus) if host.ct.provides(f"/dev/nvidia{i}"))
    probe, error = container_probe(client, target, expected, needs)
    return Facts(target=target, host=host, probe=probe, expected_gpus=expected, needs=needs, smi_gpus=smi_gpus,
                 probe_error=error)
