"""The GPU checks: the driver's two halves agree, the device nodes are there and open, the CT config passes
them through, and no GPU holds memory that no run accounts for."""
from __future__ import annotations

from dflash_records.gpu import held_without_run
from dflash_records.protocol import MIB

from ...display import format_bytes
from .facts import Facts, expected_nodes
from .report import FAIL, OK, WARN, Row, see

FRONTEND = ("nvidia-frontend", "nvidia")   # the major of nvidiactl and nvidia0..N (195)
UVM = "nvidia-uvm"


def _ct(facts: Facts) -> str:
    return str(facts.target.ctid)


def driver(facts: Facts) -> Row:
    module, lib = facts.host.module_version, (facts.probe.nvml or {}).get("version")
    on_ct = facts.target.ctid is not None
    if not facts.expected_gpus and not module and not lib:
        return Row("driver", OK, "no NVIDIA GPU expected and no driver found")
    if not module:
        return Row("driver", FAIL, f"no NVIDIA kernel module on {facts.target.host.name} "
                                   "(/proc/driver/nvidia/version is missing)",
                   f"install the NVIDIA driver on {facts.target.host.name} and load it (`modprobe nvidia`); "
                   + see("driver"))
    if not lib:
        return Row("driver", FAIL, f"no libnvidia-ml.so.<version> in {facts.target.name}: the NVIDIA user-space "
                                   "driver is not installed there",
                   f"in the container: `sh NVIDIA-Linux-x86_64-{module}.run --no-kernel-module` (the host's "
                   f"version exactly); {see('driver')}")
    if lib != module:
        fix = (f"in CT {_ct(facts)}: `sh NVIDIA-Linux-x86_64-{module}.run --no-kernel-module` (the host's "
               f"version exactly); {see('driver')}" if on_ct else
               "reboot the host so the kernel module matches the installed driver")
        return Row("driver", FAIL, f"host kernel module {module} but libnvidia-ml {lib} in {facts.target.name}: "
                                   "NVML fails with 'Driver/library version mismatch'", fix)
    return Row("driver", OK, f"{module}: host kernel module and libnvidia-ml in {facts.target.name} agree")


def _node_problem(path: str, node: dict | None) -> tuple[str, str] | None:
    """(kind, description) of what is wrong with one node, None when it opens."""
    node = node or {"kind": "missing"}
    if node["kind"] == "missing":
        return "missing", f"{path} is missing"
    if node["kind"] != "char":
        return "file", f"{path} is a {node['kind']}, not a device (the host had no {path} when the container started)"
    if node.get("error"):
        return "denied", f"{path} does not open: {node['error']}"
    return None


def device_nodes(facts: Facts) -> Row | None:
    if not facts.expected_gpus:
        return None
    devices = facts.probe.devices or {}
    problems = [p for p in (_node_problem(path, devices.get(path)) for path in expected_nodes(facts.expected_gpus))
                if p is not None]
    if not problems:
        return Row("device_nodes", OK, f"{len(expected_nodes(facts.expected_gpus))} /dev/nvidia* nodes present "
                                       "and openable")
    kinds = {kind for kind, _ in problems}
    detail = "; ".join(text for _, text in problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
    if facts.target.ctid is None:
        fix = "load the driver's device nodes: `nvidia-modprobe -u -c=0` and `nvidia-smi` once as root"
    elif kinds == {"file"}:
        fix = (f"on {facts.target.host.name}: `nvidia-modprobe -u -c=0` (makes /dev/nvidia-uvm), then "
               f"`pct reboot {_ct(facts)}`; {see('devices')}")
    elif "denied" in kinds:
        fix = (f"allow the devices in /etc/pve/lxc/{_ct(facts)}.conf (`lxc.cgroup2.devices.allow: c 195:* rwm` and "
               f"the nvidia-uvm major from /proc/devices), then `pct reboot {_ct(facts)}`; {see('devices')}")
    else:
        fix = (f"bind the nodes in /etc/pve/lxc/{_ct(facts)}.conf (`lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none "
               f"bind,optional,create=file`, one per node), then `pct reboot {_ct(facts)}`; {see('devices')}")
    return Row("device_nodes", FAIL, detail, fix)


def _majors(facts: Facts) -> dict[str, int]:
    """The majors a container needs allowed: the GPUs' and nvidia-uvm's, as this host numbers them."""
    found = facts.host.majors
    majors = {name: found[name] for name in (*FRONTEND, UVM) if name in found}
    return majors or {"nvidia-frontend": 195}


def ct_devices(facts: Facts) -> Row | None:
    ct = facts.host.ct
    if facts.target.ctid is None or not facts.expected_gpus:
        return None
    if ct is None:
        return Row("ct_config", WARN, facts.host.error or "no CT config read",
                   f"check `pct config {_ct(facts)}` by hand; {see('devices')}")
    nodes = expected_nodes(facts.expected_gpus)
    unmounted = [n for n in nodes if not ct.provides(n)]
    passed = all(n in ct.passthrough for n in nodes)
    denied = [] if passed else [(name, m) for name, m in _majors(facts).items() if not ct.allows(m)]
    if not unmounted and not denied:
        return Row("ct_config", OK, f"/etc/pve/lxc/{_ct(facts)}.conf allows and binds every /dev/nvidia* node")
    parts = [f"no lxc.cgroup2.devices.allow for {name} (major {m})" for name, m in denied]
    parts += [f"no lxc.mount.entry for {', '.join(unmounted[:4])}" + (" ..." if len(unmounted) > 4 else "")] \
        if unmounted else []
    lines = [f"`lxc.cgroup2.devices.allow: c {m}:* rwm`" for _, m in denied]
    lines += [f"`lxc.mount.entry: {n} {n.lstrip('/')} none bind,optional,create=file`" for n in unmounted[:2]]
    more = len(denied) + len(unmounted) - len(lines)
    fix = (f"add to /etc/pve/lxc/{_ct(facts)}.conf: {', '.join(lines)}" + (f" (+{more} more)" if more > 0 else "")
           + f", then `pct reboot {_ct(facts)}`; {see('devices')}")
    return Row("ct_config", FAIL, "; ".join(parts), fix)


def gpus_unclaimed(facts: Facts) -> Row | None:
    if facts.smi_gpus is None or facts.probe.live_gpus is None:
        return None  # no nvidia-smi, or it fails: the nvidia-smi row says so
    live = list(facts.probe.live_gpus)
    unclaimed = held_without_run(facts.smi_gpus, live)
    if not unclaimed:
        return Row("gpus_held", OK, f"no GPU holds memory outside a live run ({len(live)} live)")
    shown = ", ".join(f"GPU {g.index} {format_bytes((g.memory_used_mib or 0) * MIB)} at "
                      f"{g.utilization_pct:g} %" for g in unclaimed[:4])
    host = facts.target.host.name
    fix = (f"`nvidia-smi` on {host} names the PID (inside a container it cannot): end it, or restart its container"
           if facts.target.ctid is not None else "`nvidia-smi` names the PID: end it")
    return Row("gpus_held", WARN, f"memory held with no live run: {shown}" + (" ..." if len(unclaimed) > 4 else ""),
               fix + f"; `dflashctl cleanup {facts.target.name}` ends what dflashctl's runs left; {see('held')}")
