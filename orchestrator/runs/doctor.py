"""`dflashctl doctor`: can we reach each target, and does it have what a run needs?

Checks in the order a person would debug them: network, host key, login, pct, container state, the
container's python (the supervisor needs >= 3.8), nvidia-smi and its GPUs. The first failing check stops the
target's checks and becomes its error; the checks before it stay in the report. Along the way it notes how
big the target's compile cache is (`{workdir}/.dflash/cache`, what launch points torch.compile at).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..errors import AuthError, CommandTimeout, DflashError, HostKeyError, Unreachable
from ..gpus import parse_query_csv, query_argv
from ..inventory.model import Target
from ..transports.base import Transport
from ..transports.pct import PctTransport
from ..transports.pool import Connections
from .compilecache import cache_root, parse_size_kib, size_argv
from .doctorchecks import check_agent, check_free_space

MIN_PYTHON = (3, 8)
PYTHON_VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


@dataclass
class DoctorReport:
    target: str
    ok: bool = False
    error: str | None = None
    unreachable: bool = False
    reachable: bool | None = None
    host_key_ok: bool | None = None
    auth_ok: bool | None = None
    pct: bool | None = None          # None where the target has no container
    container: str | None = None     # running / stopped / missing
    python: str | None = None
    nvidia_smi: bool | None = None
    gpus: list[dict] | None = None
    cache_dir: str | None = None
    cache_bytes: int | None = None   # 0 where nothing was compiled there yet
    agent: str | None = None         # the deployed agent: ok / absent / damaged (doctorchecks.py)
    free_bytes: int | None = None    # free space of the workdir's filesystem (doctorchecks.py)
    warnings: list[str] = field(default_factory=list)
    elapsed_ms: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class _Stop(Exception):
    """A check failed; its message is the target's error."""


def check_target(conns: Connections, target: Target) -> DoctorReport:
    report = DoctorReport(target.name)
    started = time.monotonic()
    try:
        _check_login(conns, target, report)
        if target.ctid is not None:
            _check_container(conns.host_transport(target.host), target, report)
        transport = conns.for_target(target)
        _check_python(transport, target, report)
        _measure_cache(transport, target, report)
        check_agent(transport, target, report)
        check_free_space(transport, target, report)
        _check_gpus(transport, target, report)
        report.ok = True
    except _Stop as stop:
        report.error = str(stop)
    except Unreachable as exc:  # the link died between checks
        report.error, report.unreachable = str(exc), True
    except DflashError as exc:
        report.error = str(exc)
    report.elapsed_ms = round((time.monotonic() - started) * 1000)
    return report


def _check_login(conns: Connections, target: Target, report: DoctorReport) -> None:
    if target.host.transport == "local":
        report.reachable = True
        return
    try:
        conns.connect(target.host)
    except HostKeyError as exc:
        report.reachable, report.host_key_ok, report.unreachable = True, False, True
        raise _Stop(str(exc)) from None
    except AuthError as exc:
        report.reachable, report.host_key_ok, report.auth_ok, report.unreachable = True, True, False, True
        raise _Stop(str(exc)) from None
    except Unreachable as exc:
        report.reachable, report.unreachable = False, True
        raise _Stop(str(exc)) from None
    report.reachable = report.host_key_ok = report.auth_ok = True


def _check_container(host: Transport, target: Target, report: DoctorReport) -> None:
    pct = PctTransport(host, target.ctid, pct_command=target.host.pct).pct
    result = host.run([*pct, "status", str(target.ctid)], timeout=30)
    if result.program_missing:
        report.pct = False
        raise _Stop(f"`{target.host.pct}` not found on {target.host.name}; is it a Proxmox VE host? "
                    f"(set `pct:` in the inventory, e.g. `sudo pct` or a full path)")
    report.pct = True
    text = (result.out + result.err).strip()
    if "does not exist" in text:
        report.container = "missing"
        raise _Stop(f"container {target.ctid} does not exist on {target.host.name}: {text}")
    status = text.removeprefix("status:").strip() if result.ok else "unknown"
    report.container = status
    if status != "running":
        raise _Stop(f"container {target.ctid} is {status}: start it with `pct start {target.ctid}` on "
                    f"{target.host.name}" + ("" if result.ok else f" ({result.describe()})"))


def _check_python(transport: Transport, target: Target, report: DoctorReport) -> None:
    result = transport.run([target.python, "-c", PYTHON_VERSION], timeout=30)
    if not result.ok:
        raise _Stop(f"{target.python} does not run on {target.name}: {result.describe()} "
                    f"(set `python:` for this target in the inventory)")
    report.python = result.out.strip()
    version = tuple(int(p) for p in report.python.split(".")[:2] if p.isdigit())
    if version < MIN_PYTHON:
        raise _Stop(f"{target.python} on {target.name} is Python {report.python}; the run supervisor needs "
                    f">= {'.'.join(map(str, MIN_PYTHON))}")


def _measure_cache(transport: Transport, target: Target, report: DoctorReport) -> None:
    """The compile cache's size; a cache that cannot be measured is a warning, never a failed check."""
    report.cache_dir = cache_root(target)
    try:
        result = transport.run(size_argv(target), timeout=60)
    except CommandTimeout:
        report.warnings.append(f"the compile cache {report.cache_dir} took over 60 s to measure")
        return
    report.cache_bytes = parse_size_kib(result.out) if result.ok else None
    if report.cache_bytes is None:
        report.warnings.append(f"cannot measure the compile cache {report.cache_dir}: {result.describe()}")


def _check_gpus(transport: Transport, target: Target, report: DoctorReport) -> None:
    result = transport.run(query_argv(), timeout=30)
    if result.program_missing:
        report.nvidia_smi, report.gpus = False, []
        if target.gpus:
            raise _Stop(f"nvidia-smi not found on {target.name}, but the inventory gives it {target.gpus} GPUs")
        return
    report.nvidia_smi = True
    if not result.ok:
        raise _Stop(f"nvidia-smi fails on {target.name}: {result.describe()}")
    gpus = parse_query_csv(result.out)
    report.gpus = [g.as_dict() for g in gpus]
    if target.gpus and len(gpus) != target.gpus:
        report.warnings.append(f"the inventory says {target.gpus} GPUs, nvidia-smi shows {len(gpus)}")
