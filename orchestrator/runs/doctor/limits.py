"""The CPU and memory a container may use against what a run of it starts (a process per GPU and its
data threads; the target model passes through host memory while it loads)."""
from __future__ import annotations

from dflash_records.protocol import GIB, MIB

from ...display import format_bytes
from .facts import Facts
from .report import OK, WARN, Row, see

MEMORY_PER_PROCESS = 2 * GIB   # python, torch and CUDA's host-side state of one training process


def _cpus(facts: Facts) -> int | None:
    seen = (facts.probe.limits or {}).get("cpus")
    ct = facts.host.ct
    values = [v for v in (seen, ct.cores if ct else None) if v]
    return min(values) if values else None


def _memory(facts: Facts) -> int | None:
    limits = facts.probe.limits or {}
    total, cap = limits.get("mem_total_bytes"), limits.get("memory_max_bytes")
    ct = facts.host.ct
    values = [v for v in (total, cap if cap and total and cap < total else None,
                          ct.memory_mib * MIB if ct else None) if v]
    return min(values) if values else None


def needed(facts: Facts) -> tuple[int, int]:
    """(CPUs, bytes of memory) a run needs here."""
    workers = facts.needs.num_workers if facts.needs else 0
    model = ((facts.probe.model or {}).get("size_bytes") or 0) if facts.needs else 0
    return facts.nproc * (1 + workers) + (0 if facts.needs else 1), model + MEMORY_PER_PROCESS * facts.nproc


def limits(facts: Facts) -> Row | None:
    cpus, memory = _cpus(facts), _memory(facts)
    if cpus is None and memory is None:
        return None
    want_cpus, want_memory = needed(facts)
    host = facts.host
    found = (f"{cpus} CPU(s)" + (f" of the host's {host.cpus}" if host.ct and host.cpus else "")
             + f", {format_bytes(memory)}" + (f" of {format_bytes(host.mem_bytes)}" if host.ct and host.mem_bytes else ""))
    short, options = [], []
    if cpus is not None and cpus < want_cpus:
        short.append(f"{want_cpus} CPUs")
        options.append(f"--cores {want_cpus}")
    if memory is not None and memory < want_memory:
        short.append(f"{format_bytes(want_memory)}")
        options.append(f"--memory {-(-want_memory // MIB)}")
    if not short:
        return Row("limits", OK, found)
    why = f"{facts.nproc} process(es)" + (f" with {facts.needs.num_workers} data thread(s) each and the target "
                                          "model loading" if facts.needs else "")
    if facts.target.ctid is not None:
        fix = (f"`pct set {facts.target.ctid} {' '.join(options)}` on {facts.target.host.name} "
               f"(or fewer GPUs per run); {see('limits')}")
    else:
        fix = "run fewer processes or data threads, or use a bigger machine"
    return Row("limits", WARN, f"{found}: {why} want {' and '.join(short)}", fix)
