#!/usr/bin/python3
"""Fake `nvidia-smi` of the lab containers (installed as /opt/lab/bin/nvidia-smi).

Its GPUs come from ../gpus.json next to its bin/ directory, re-read on every sample: a list of GPUs, each a
dict of --query-gpu field name (or alias) -> value, or {"gpus": [...], "processes": [...], "timestamp":
"Mon Nov 30 23:42:45 2026"}. Missing fields take an idle H200's values (the real fixtures'). A string value
is printed as it is (e.g. "[N/A]"); numbers get the real tool's formatting and units. Processes are empty by
default, as nvidia-smi shows them inside an LXC container. The valid field names come from the real
`--help-query-gpu` text in ../share/help_query_gpu.txt.

Answers: --query-gpu=F1,F2 --format=csv[,noheader][,nounits], --query-compute-apps=..., -i/--id, -l/--loop,
-L, --version, --help-query-gpu, and plain `nvidia-smi` (the table). Exit codes as the real one: 0, 2 for a
bad argument or field, 6 when -i names no GPU, 9 when there is no driver (no state file), 18 with "Failed to
initialize NVML: Driver/library version mismatch" when the kernel module (/proc/driver/nvidia/version, in a lab
container its host's) and the container's libnvidia-ml.so.<version> differ.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent.parent
STATE_FILE = LAB_DIR / "gpus.json"
HELP_FILE = LAB_DIR / "share" / "help_query_gpu.txt"
DRIVER, CUDA = "580.159.04", "13.0"
VERSION_TEXT = f"NVIDIA-SMI version  : {DRIVER}\nNVML version        : 580.159\nDRIVER version      : {DRIVER}\nCUDA Version        : {CUDA}\n"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n\n")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {}\n"
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
IDLE_H200 = {
    "name": "NVIDIA H200", "serial": "0000000000000", "driver_version": DRIVER, "persistence_mode": "Enabled",
    "pstate": "P0", "fan.speed": "[N/A]", "memory.total": 143771, "memory.reserved": 616, "memory.used": 0,
    "utilization.gpu": 0, "utilization.memory": 0, "temperature.gpu": 37, "temperature.memory": 39,
    "power.draw": 123.71, "power.limit": 700.0, "enforced.power.limit": 700.0, "power.default_limit": 700.0,
    "power.min_limit": 200.0, "power.max_limit": 700.0, "clocks.current.graphics": 1980,
    "clocks.current.sm": 1980, "clocks.current.memory": 3201, "clocks.current.video": 1545,
    "clocks.max.graphics": 1980, "clocks.max.sm": 1980, "clocks.max.memory": 3201, "compute_mode": "Default",
    "mig.mode.current": "Disabled", "mig.mode.pending": "Disabled", "ecc.mode.current": "Enabled",
    "display_active": "Disabled", "vbios_version": "96.00.A5.00.1A", "compute_cap": "9.0",
}
APP_FIELDS = {"pid": "pid", "process_name": "process_name", "name": "process_name",
              "used_gpu_memory": "used_gpu_memory", "used_memory": "used_gpu_memory",
              "gpu_uuid": "gpu_uuid", "gpu_name": "gpu_name", "gpu_bus_id": "gpu_bus_id",
              "gpu_serial": "gpu_serial", "timestamp": "timestamp"}


class UsageError(Exception):
    """Printed on stdout (the real tool's habit), exit 2."""

    exit_code = 2


class NoDevicesError(UsageError):
    exit_code = 6


def field_aliases() -> dict[str, str]:
    """Every queryable name and alias -> canonical name, from the real help text."""
    aliases: dict[str, str] = {}
    for line in HELP_FILE.read_text().splitlines():
        if line.startswith('"'):
            names = re.findall(r'"([^"]+)"', line)
            for name in names:
                aliases[name] = names[0]
    return aliases


def unit_of(field: str) -> str:
    if field.startswith("memory.") or field == "used_gpu_memory":
        return "MiB"
    if field.startswith("utilization.") or field == "fan.speed":
        return "%"
    if "power" in field and not field.startswith("power_smoothing") and field != "power.management":
        return "W"
    if field.startswith("clocks.") and "reasons" not in field:
        return "MHz"
    return ""


def load_state() -> dict | None:
    try:
        raw = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        return None
    return raw if isinstance(raw, dict) else {"gpus": raw}


def complete_gpus(state: dict, aliases: dict[str, str]) -> list[dict]:
    gpus = []
    for position, given in enumerate(state.get("gpus", [])):
        gpu = dict(IDLE_H200)
        index = int(given.get("index", position))
        gpu.update(index=index, uuid=f"GPU-00000000-1111-2222-3333-{444444444444 + index}",
                   **{"pci.bus_id": f"00000000:00:{6 + index:02X}.0"})
        gpu.update({aliases.get(key, key): value for key, value in given.items()})
        if "memory.free" not in gpu and isinstance(gpu["memory.used"], int):
            gpu["memory.free"] = gpu["memory.total"] - gpu["memory.reserved"] - gpu["memory.used"]
        gpu["count"] = len(state["gpus"])
        gpus.append(gpu)
    return gpus


def format_value(field: str, value: object, *, units: bool) -> str:
    if isinstance(value, str):
        return value
    unit = unit_of(field)
    text = f"{float(value):.2f}" if unit == "W" else str(int(value)) if isinstance(value, (int, float)) else str(value)
    return f"{text} {unit}" if units and unit else text


def csv_lines(fields: list[str], rows: list[dict], fmt: set[str]) -> list[str]:
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(f"{f} [{unit_of(f)}]" if unit_of(f) else f for f in fields))
    for row in rows:
        values = [row.get(f, "[N/A]") for f in fields]
        lines.append(", ".join(format_value(f, v, units="nounits" not in fmt) for f, v in zip(fields, values)))
    return lines


def parse_format(text: str | None) -> set[str]:
    parts = set((text or "").split(","))
    if "csv" not in parts or not parts <= {"csv", "noheader", "nounits"}:
        raise UsageError(f'"{text}" is not a valid format.' if text else "'--format' option is required\n")
    return parts


def query_gpus(fields_text: str, fmt_text: str | None, gpus: list[dict], aliases: dict[str, str],
               header: bool) -> list[str]:
    fields = []
    for name in fields_text.split(","):
        if name not in aliases:
            raise UsageError(f'Field "{name}" is not a valid field to query.\n')
        fields.append(aliases[name])
    fmt = parse_format(fmt_text)
    now = time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}"
    rows = [{"timestamp": now, **gpu} for gpu in gpus]
    return csv_lines(fields, rows, fmt if header else fmt | {"noheader"})


def query_apps(fields_text: str, fmt_text: str | None, state: dict, gpus: list[dict]) -> list[str]:
    fields = []
    for name in fields_text.split(","):
        if name not in APP_FIELDS:
            raise UsageError(f'Field "{name}" is not a valid field to query.\n')
        fields.append(APP_FIELDS[name])
    by_index = {gpu["index"]: gpu for gpu in gpus}
    rows = []
    for proc in state.get("processes", []):
        gpu = by_index.get(proc.get("gpu", 0), {})
        rows.append({"pid": proc["pid"], "process_name": proc.get("process_name", "python3"),
                     "used_gpu_memory": proc.get("used_memory", 0), "gpu_uuid": gpu.get("uuid", "[N/A]"),
                     "gpu_name": gpu.get("name"), "gpu_bus_id": gpu.get("pci.bus_id"),
                     "gpu_serial": gpu.get("serial")})
    return csv_lines(fields, rows, parse_format(fmt_text))


RULE = "+" + "-" * 89 + "+"
GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
TABLE_HEAD = [
    RULE,
    f"| NVIDIA-SMI {DRIVER}             Driver Version: {DRIVER}     CUDA Version: {CUDA}     |",
    GPU_RULE,
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
]
PROCESS_HEAD = [
    RULE,
    "| Processes:" + " " * 78 + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
]


def on_off(value: object) -> str:
    return "On" if value in ("Enabled", "On") else "Off"


def gpu_block(gpu: dict) -> list[str]:
    fan = "N/A" if str(gpu["fan.speed"]).startswith("[") else f"{gpu['fan.speed']}%"
    ecc = gpu.get("ecc.errors.uncorrected.volatile.total", 0)
    power = f"{int(gpu['power.draw'])}W / {int(gpu['power.limit']):>4}W"
    return [
        f"|{gpu['index']:>4}  {str(gpu['name']):<31.31}{on_off(gpu['persistence_mode']):<4}"
        f"|{gpu['pci.bus_id']:>19} {on_off(gpu['display_active']):<4}|{ecc:>21} |",
        f"|{fan:>4}{gpu['temperature.gpu']:>5}C{gpu['pstate']:>6}{power:>24} "
        f"|{gpu['memory.used']:>8}MiB / {gpu['memory.total']:>6}MiB |{gpu['utilization.gpu']:>7}%"
        f"{gpu['compute_mode']:>13} |",
        f"|{'':41}|{'':24}|{gpu['mig.mode.current']:>21} |",
        GPU_RULE,
    ]


def process_rows(state: dict) -> list[str]:
    rows = []
    for proc in state.get("processes", []):
        memory = f"{proc.get('used_memory', 0)}MiB"
        rows.append(f"|{proc.get('gpu', 0):>5}   N/A  N/A{proc['pid']:>16}{proc.get('type', 'C'):>7}   "
                    f"{proc.get('process_name', 'python3'):<34.34}{memory:>12} |")
    return rows or ["|  No running processes found" + " " * 61 + "|"]


def table(state: dict, gpus: list[dict]) -> list[str]:
    stamp = state.get("timestamp") or time.strftime("%a %b %e %H:%M:%S %Y")
    lines = [f"{stamp}       ", *TABLE_HEAD]
    for gpu in gpus:
        lines += gpu_block(gpu)
    return [*lines, "", *PROCESS_HEAD, *process_rows(state), RULE]


def parse_args(argv: list[str]) -> dict[str, str]:
    """nvidia-smi style options: --opt=value, --opt value, -l 1, -l1, -i 0,1 and bare flags."""
    takes_value = {"--query-gpu", "--query-compute-apps", "--format", "--loop", "-l", "--id", "-i"}
    opts: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, _, value = arg.partition("=")
        if name in ("-l", "-i") or (arg[:2] in ("-l", "-i") and len(arg) > 2 and not arg.startswith("--")):
            name, value = arg[:2], arg[2:] or (args.pop(0) if args else "")
        elif name in takes_value and not value:
            value = args.pop(0) if args else ""
        elif name not in takes_value and name not in ("-L", "--list-gpus", "--version", "--help-query-gpu", "-h", "--help"):
            raise UsageError(BAD_ARGS.rstrip("\n") + "\n")
        opts[{"-l": "--loop", "-i": "--id", "--list-gpus": "-L", "--help": "-h"}.get(name, name)] = value
    return opts


def select(gpus: list[dict], ids: str | None) -> list[dict]:
    if ids is None:
        return gpus
    wanted = ids.split(",")
    chosen = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
    if len(chosen) != len(wanted):
        raise NoDevicesError("No devices were found\n")
    return chosen


def render(opts: dict[str, str], state: dict, first: bool) -> list[str]:
    aliases = field_aliases() if "--query-gpu" in opts else {}
    gpus = select(complete_gpus(state, aliases), opts.get("--id"))
    if "--query-gpu" in opts:
        return query_gpus(opts["--query-gpu"], opts.get("--format"), gpus, aliases, header=first)
    if "--query-compute-apps" in opts:
        return query_apps(opts["--query-compute-apps"], opts.get("--format"), state, gpus)
    if "-L" in opts:
        return [f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in gpus]
    return table(state, gpus)


def driver_versions() -> tuple[str | None, str | None]:
    """(the kernel module's version, libnvidia-ml's) as NVML finds them: /proc/driver/nvidia/version (a lab
    container sees its host's) and the libnvidia-ml.so.<version> in the system's library directory."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None, None
    module = re.search(r"Kernel Module(?: for \S+)?\s+(\S+)", text)
    libs = [p.name.split(".so.", 1)[1] for p in Path("/usr/lib").glob("*-linux-gnu/libnvidia-ml.so.*.*")]
    return (module.group(1) if module else None), (libs[0] if libs else None)


def run(opts: dict[str, str]) -> int:
    module, library = driver_versions()
    if module and library and module != library:
        sys.stdout.write(MISMATCH.format(library.rsplit(".", 1)[0] if library.count(".") > 1 else library))
        return 18
    interval = float(opts["--loop"]) if "--loop" in opts else None
    first = True
    while True:
        state = load_state()
        if state is None:
            sys.stdout.write(NO_DRIVER)
            return 9
        lines = render(opts, state, first)
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        if interval is None:
            return 0
        first = False
        time.sleep(interval)


def main(argv: list[str]) -> int:
    try:
        opts = parse_args(argv)
        if "--version" in opts:
            sys.stdout.write(VERSION_TEXT)
            return 0
        if "--help-query-gpu" in opts:
            sys.stdout.write(HELP_FILE.read_text())
            return 0
        return run(opts)
    except UsageError as exc:
        sys.stdout.write(f"{exc}\n")
        return exc.exit_code
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
