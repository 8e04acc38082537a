"""`netinfo`: how this container reaches an address (the local address and interface a connection to it
uses), and optionally a TCP port that is free here. A multi-node job asks every node for the first, and
its first node for the second, before it starts torchrun anywhere."""
from __future__ import annotations

import array
import fcntl
import socket
import struct

from dflash_records.answers import NetInfo

from .errors import BadInput, OperationFailed

SIOCGIFADDR = 0x8915


def interface_addresses() -> dict:
    """IPv4 address -> interface name, for every interface that has one."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            request = array.array("B", struct.pack("256s", name.encode()[:15]))
            try:
                fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address on this interface
            found[socket.inet_ntoa(request.tobytes()[20:24])] = name
    return found


def source_address(toward: str) -> str:
    """The local address the kernel picks for a connection to `toward` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(toward, 9, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise BadInput("cannot resolve {!r}: {}".format(toward, exc), code="bad_address")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(infos[0][4])
        except OSError as exc:
            raise OperationFailed("no route to {}: {}".format(toward, exc), code="no_route")
        return sock.getsockname()[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def netinfo(toward: str, *, want_port: bool) -> NetInfo:
    address = source_address(toward)
    return NetInfo(ok=True, toward=toward, address=address, interface=interface_addresses().get(address),
                   hostname=socket.gethostname(), port=free_port() if want_port else None)
