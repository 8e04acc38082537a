"""Network plumbing of the lab: one network namespace per fake Proxmox host, joined to the root namespace
by a veth pair with a /30 of its own from the benchmarking range 198.18.0.0/15.

Taking a host's link down must make new connections time out and stall existing ones, the way a pulled
cable does, never refuse them. With the root-side veth down the kernel drops the host's connected route, so
each lab keeps one drop device (an `ifb`, or a veth with its peer down where ifb is missing: either silently
swallows what is sent to it, and with ARP off it never answers "no route to host") with a low-priority route
to every host subnet. While a host's veth is down, packets for it vanish there instead of following the
default route out of the machine.

Hosts reach each other through the root namespace, as Proxmox nodes of one cluster do through their switch:
each host namespace routes the other lab subnets via its root-side address, and the root namespace forwards
only what arrives on this lab's veths (per-device forwarding, never the global switch) and only towards this
lab's subnets (a policy rule per veth into a table of `throw` routes for the lab subnets and a blackhole for
everything else). Taking a host's link down still cuts it off from every other host.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import random
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LAB_RANGE = ipaddress.ip_network("198.18.0.0/15")
DROP_ROUTE_METRIC = 4242
RULE_PREFERENCE = 4242
TABLE_BASE = 0x10000000     # + the lab's device prefix number: one routing table per lab
NETNS_PREFIX = "dflab-"


class LabSetupError(RuntimeError):
    """The lab could not be built on this machine."""


@dataclass(frozen=True)
class HostLink:
    netns: str
    root_veth: str
    host_veth: str
    subnet: ipaddress.IPv4Network
    root_address: str
    address: str


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LabSetupError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


@contextmanager
def allocation_lock() -> Iterator[None]:
    """Serialises subnet choice and creation between labs of concurrent test runs on one machine."""
    path = os.path.join(tempfile.gettempdir(), "dflashctl-lab.lock")
    with open(path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def networks_in_use() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and route.get("type", "unicast") in ("unicast", "local", "broadcast"):
            used.append(ipaddress.ip_network(dst, strict=False))
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for info in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    return used


def free_subnet(taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /30 of the lab range that no route or address of this machine overlaps (random start, so two
    labs rarely even look at the same candidates)."""
    blocks = LAB_RANGE.num_addresses // 4
    start = random.randrange(blocks)
    for step in range(blocks):
        base = LAB_RANGE.network_address + ((start + step) % blocks) * 4
        candidate = ipaddress.ip_network(f"{base}/30")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise LabSetupError("no free /30 left in 198.18.0.0/15")


def create_drop_device(name: str) -> None:
    if ip("link", "add", name, "type", "ifb", check=False).returncode != 0:
        # Kernels without ifb: a veth whose peer stays down swallows packets the same way.
        ip("link", "add", name, "type", "veth", "peer", "name", name[:-1] + "e")
    ip("link", "set", name, "arp", "off")
    ip("link", "set", name, "up")


def create_host_link(netns: str, root_veth: str, host_veth: str, drop_device: str) -> HostLink:
    """Creates the namespace and its veth pair; must run under allocation_lock()."""
    subnet = free_subnet(networks_in_use())
    root_address, address = (str(a) for a in subnet.hosts())
    link = HostLink(netns, root_veth, host_veth, subnet, root_address, address)
    try:
        ip("netns", "add", netns)
        ip("link", "add", root_veth, "type", "veth", "peer", "name", host_veth)
        ip("link", "set", host_veth, "netns", netns)
        ip("addr", "add", f"{root_address}/30", "dev", root_veth)
        ip("link", "set", root_veth, "up")
        ip("-n", netns, "addr", "add", f"{address}/30", "dev", host_veth)
        ip("-n", netns, "link", "set", host_veth, "up")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("route", "add", str(subnet), "dev", drop_device, "metric", str(DROP_ROUTE_METRIC))
    except BaseException:
        remove_host_link(link)
        raise
    return link


def set_link(link: HostLink, *, up: bool) -> None:
    ip("link", "set", link.root_veth, "up" if up else "down")


def remove_host_link(link: HostLink) -> None:
    # Deleting one end of a veth deletes both; the namespace itself is then empty.
    ip("link", "del", link.root_veth, check=False)
    ip("netns", "del", link.netns, check=False)


def remove_device(name: str) -> None:
    ip("link", "del", name, check=False)


def lab_table(prefix: str) -> int:
    return TABLE_BASE + int(prefix[3:], 16)


def _set_forwarding(device: str, *, on: bool) -> None:
    try:
        with open(f"/proc/sys/net/ipv4/conf/{device}/forwarding", "w") as knob:
            knob.write("1" if on else "0")
    except FileNotFoundError:
        pass  # the device is gone already


def connect_hosts(links: list[HostLink], table: int) -> None:
    """Lets every lab host reach every other one through the root namespace (see the module docstring)."""
    table_arg = str(table)
    ip("route", "add", "blackhole", "default", "table", table_arg)
    for link in links:
        ip("route", "add", "throw", str(link.subnet), "table", table_arg)
    for link in links:
        ip("rule", "add", "iif", link.root_veth, "lookup", table_arg, "pref", str(RULE_PREFERENCE))
        _set_forwarding(link.root_veth, on=True)
        for other in links:
            if other is not link:
                ip("-n", link.netns, "route", "add", str(other.subnet), "via", link.root_address)


def disconnect_hosts(links: list[HostLink], table: int) -> None:
    """Undoes connect_hosts in the root namespace (routes inside the host namespaces go with them)."""
    for link in links:
        _set_forwarding(link.root_veth, on=False)
    remove_rules_of_table(table)
    ip("route", "flush", "table", str(table), check=False)


def remove_rules_of_table(table: int) -> None:
    for rule in json.loads(ip("-j", "rule", "list", check=False).stdout or "[]"):
        if str(rule.get("table")) == str(table):
            ip("rule", "del", "pref", str(rule["priority"]), "table", str(table), check=False)


def stale_lab_tables() -> list[int]:
    """Routing tables (and their rules) of labs whose test process is gone."""
    tables = set()
    for rule in json.loads(ip("-j", "rule", "list", check=False).stdout or "[]"):
        table = str(rule.get("table", ""))
        if table.isdigit() and TABLE_BASE <= int(table) < 2 * TABLE_BASE:
            if _owner_gone(f"{(int(table) - TABLE_BASE) >> 4:x}", 16):
                tables.add(int(table))
    return sorted(tables)


def netns_pids(netns: str) -> list[int]:
    out = ip("netns", "pids", netns, check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def device_prefix(owner_pid: int, seq: int) -> str:
    """Interface names hold at most 15 characters: 'dfl' + owner pid (6 hex) + lab number (1 hex)."""
    return f"dfl{owner_pid:06x}{seq % 16:x}"


def _owner_gone(pid_text: str, base: int) -> bool:
    try:
        return not os.path.exists(f"/proc/{int(pid_text, base)}")
    except ValueError:
        return False


def stale_lab_namespaces() -> list[str]:
    """Namespaces of labs whose test process is gone (named dflab-<pid>-...)."""
    stale = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        parts = line.split()[0].split("-") if line.strip() else []
        if len(parts) > 2 and f"{parts[0]}-" == NETNS_PREFIX and _owner_gone(parts[1], 10):
            stale.append(line.split()[0])
    return stale


def stale_lab_devices() -> list[str]:
    names = [link.get("ifname", "") for link in json.loads(ip("-j", "link").stdout or "[]")]
    return [n for n in names if n.startswith("dfl") and len(n) >= 9 and _owner_gone(n[3:9], 16)]
