"""Lab hosts reach each other through the root namespace, and a host whose link is down reaches no one."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.lab.lab import HostSpec, Lab

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    with socket.create_connection((sys.argv[1], 22), timeout=float(sys.argv[2])) as s:\n"
           "        print(s.recv(8).decode())\n"
           "except OSError as exc:\n"
           "    print(type(exc).__name__)\n")


def connect_from(lab: Lab, host: str, ctid: int, address: str, timeout: float = 2) -> str:
    """What a process in the container sees when it opens a TCP connection to address:22."""
    result = lab.ct_run(host, ctid, ["python3", "-c", CONNECT, address, str(timeout)], text=True,
                        timeout=timeout + 10)
    return result.stdout.strip()


def test_containers_of_different_hosts_reach_each_other(lab: Lab) -> None:
    assert connect_from(lab, "pve1", 200, lab.hosts["pve2"].address) == "SSH-2.0-"
    assert connect_from(lab, "pve2", 300, lab.hosts["pve1"].address) == "SSH-2.0-"


def test_a_host_whose_link_is_down_is_cut_off_from_everyone(lab: Lab) -> None:
    lab.link_down("pve2")
    try:
        assert connect_from(lab, "pve1", 200, lab.hosts["pve2"].address, timeout=1) == "TimeoutError"
        assert connect_from(lab, "pve2", 300, lab.hosts["pve1"].address, timeout=1) in (
            "TimeoutError", "OSError")
    finally:
        lab.link_up("pve2")
    assert connect_from(lab, "pve1", 200, lab.hosts["pve2"].address) == "SSH-2.0-"


def test_hosts_have_no_route_out_of_the_lab(lab: Lab) -> None:
    # 192.0.2.1 (TEST-NET-1) stands for anything outside the lab
    assert connect_from(lab, "pve1", 200, "192.0.2.1", timeout=1) == "OSError"


def rules_of(table: int) -> list[dict]:
    rules = json.loads(subprocess.run(["ip", "-j", "rule", "list"], capture_output=True, text=True).stdout)
    return [r for r in rules if str(r.get("table")) == str(table)]


def test_a_lab_is_not_reachable_from_another_and_undoes_its_routing(lab: Lab, tmp_path: Path) -> None:
    forwarding_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    with Lab.start(tmp_path / "other", (HostSpec("pve1"), HostSpec("pve2"))) as other:
        table = other._table
        assert table is not None and len(rules_of(table)) == 2
        probe = subprocess.run(["ip", "netns", "exec", other.hosts["pve1"].netns, "python3", "-c", CONNECT,
                                other.hosts["pve2"].address, "2"], capture_output=True, text=True, timeout=15)
        assert probe.stdout.strip() == "SSH-2.0-"
        assert connect_from(lab, "pve1", 200, other.hosts["pve2"].address, timeout=1) == "OSError"
        root_veth = other.hosts["pve1"].link.root_veth
        assert Path(f"/proc/sys/net/ipv4/conf/{root_veth}/forwarding").read_text().strip() == "1"
    assert rules_of(table) == []
    routes = subprocess.run(["ip", "route", "show", "table", str(table)], capture_output=True, text=True)
    assert routes.stdout.strip() == ""
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding_before  # never the global switch
