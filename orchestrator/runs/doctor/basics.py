"""The checks every target gets first, in the order a person would debug them: network, host key, login, pct,
container state, the container's python (the supervisor needs >= 3.8), nvidia-smi and its GPUs. Without the
first four nothing else can run: the first of those that fails stops the target's checks and becomes its
error. Along the way it notes how big the target's compile cache is (`{workdir}/.dflash/cache`, what launch
points torch.compile at).
"""
from __future__ import annotations

from dflash_records.protocol import ascii_decimal

from ...display import format_bytes
from ...errors import AuthError, CommandTimeout, HostKeyError, Unreachable
from ...gpus import parse_query_csv, query_argv
from ...inventory.model import Target
from ...transports.base import Transport
from ...transports.pct import PctTransport
from ...transports.pool import Connections
from ...transports.timeouts import DISK_USAGE_TIMEOUT_S, PROBE_TIMEOUT_S
from ..compilecache import cache_root, parse_size_kib, size_argv
from .report import FAIL, OK, WARN, DoctorReport, Row

MIN_PYTHON = (3, 8)
PYTHON_VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


class Stop(Exception):
    """A check failed; its message is the target's error."""


def check_login(conns: Connections, target: Target, report: DoctorReport) -> None:
    if target.host.transport == "local":
        report.reachable = True
        return
    try:
        conns.connect(target.host)
    except HostKeyError as exc:
        report.reachable, report.host_key_ok, report.unreachable = True, False, True
        raise Stop(str(exc)) from None
    except AuthError as exc:
        report.reachable, report.host_key_ok, report.auth_ok, report.unreachable = True, True, False, True
        raise Stop(str(exc)) from None
    except Unreachable as exc:
        report.reachable, report.unreachable = False, True
        raise Stop(str(exc)) from None
    report.reachable = report.host_key_ok = report.auth_ok = True


def check_container(host: Transport, target: Target, report: DoctorReport) -> None:
    pct = PctTransport(host, target.ctid, pct_command=target.host.pct).pct
    result = host.run([*pct, "status", str(target.ctid)], timeout=PROBE_TIMEOUT_S)
    if result.program_missing:
        report.pct = False
        raise Stop(f"`{target.host.pct}` not found on {target.host.name}; is it a Proxmox VE host? "
                    f"(set `pct:` in the inventory, e.g. `sudo pct` or a full path)")
    report.pct = True
    text = (result.out + result.err).strip()
    if "does not exist" in text:
        report.container = "missing"
        raise Stop(f"container {target.ctid} does not exist on {target.host.name}: {text}")
    status = text.removeprefix("status:").strip() if result.ok else "unknown"
    report.container = status
    if status != "running":
        raise Stop(f"container {target.ctid} is {status}: start it with `pct start {target.ctid}` on "
                    f"{target.host.name}" + ("" if result.ok else f" ({result.describe()})"))


def check_python(transport: Transport, target: Target, report: DoctorReport) -> None:
    result = transport.run([target.python, "-c", PYTHON_VERSION], timeout=PROBE_TIMEOUT_S)
    if not result.ok:
        raise Stop(f"{target.python} does not run on {target.name}: {result.describe()} "
                    f"(set `python:` for this target in the inventory)")
    report.python = result.out.strip()
    version = tuple(n for n in map(ascii_decimal, report.python.split(".")[:2]) if n is not None)
    if version < MIN_PYTHON:
        raise Stop(f"{target.python} on {target.name} is Python {report.python}; the run supervisor needs "
                    f">= {'.'.join(map(str, MIN_PYTHON))}")


def measure_cache(transport: Transport, target: Target, report: DoctorReport) -> None:
    """The compile cache's size; a cache that cannot be measured is a warning, never a failed check."""
    report.cache_dir = cache_root(target)
    try:
        result = transport.run(size_argv(target), timeout=DISK_USAGE_TIMEOUT_S)
    except CommandTimeout:
        _cache_warning(report, f"the compile cache {report.cache_dir} took over {DISK_USAGE_TIMEOUT_S:g} s to "
                               "measure")
        return
    report.cache_bytes = parse_size_kib(result.out) if result.ok else None
    if report.cache_bytes is None:
        _cache_warning(report, f"cannot measure the compile cache {report.cache_dir}: {result.describe()}")
    else:
        report.add(Row("compile_cache", OK, f"{report.cache_dir}: {format_bytes(report.cache_bytes)}"))


def _cache_warning(report: DoctorReport, message: str) -> None:
    report.warnings.append(message)
    report.add(Row("compile_cache", WARN, message, "check that the workdir is readable"))


def check_gpus(transport: Transport, target: Target, report: DoctorReport) -> None:
    """nvidia-smi's GPUs; a failure is a row, not a stop: the driver rows after it say why."""
    result = transport.run(query_argv(), timeout=PROBE_TIMEOUT_S)
    if result.program_missing:
        report.nvidia_smi, report.gpus = False, []
        if target.gpus:
            report.add(Row("nvidia_smi", FAIL, f"nvidia-smi not found on {target.name}, but the inventory gives it "
                                               f"{target.gpus} GPUs",
                           "install the NVIDIA user-space driver there (it brings nvidia-smi)"))
        else:
            report.add(Row("nvidia_smi", OK, "not installed (no GPUs in the inventory)"))
        return
    report.nvidia_smi = True
    if not result.ok:
        said = (result.out + result.err).strip().splitlines()
        report.add(Row("nvidia_smi", FAIL, f"nvidia-smi fails on {target.name}: " + (said[0] if said else
                                                                                    result.describe()),
                       "see the driver and device_nodes rows"))
        return
    gpus = parse_query_csv(result.out)
    report.gpus = gpus
    if target.gpus and len(gpus) != target.gpus:
        message = f"the inventory says {target.gpus} GPUs, nvidia-smi shows {len(gpus)}"
        report.warnings.append(message)
        report.add(Row("nvidia_smi", WARN, message, f"correct `gpus:` of {target.name} in the inventory"))
        return
    names = sorted({g.name for g in gpus if g.name})
    report.add(Row("nvidia_smi", OK, f"{len(gpus)} GPU(s)" + (f": {', '.join(names)}" if names else "")))
