"""The transports of one dflashctl invocation: one SSH connection per host, shared by all its targets."""
from __future__ import annotations

import threading

from ..errors import DflashError
from ..inventory.model import HostConfig, Target
from .base import Transport
from .local import LocalTransport
from .pct import PctTransport
from .ssh import SSHHost, SSHTransport


class Connections:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ssh: dict[str, SSHHost] = {}
        self._failures: dict[str, DflashError] = {}

    def connect(self, host: HostConfig) -> None:
        """Open the host's connection now (doctor wants connect errors separately from command errors).

        A failure is remembered until reset(), so the second container of a dead host does not wait for a
        second connect timeout.
        """
        if host.transport == "local":
            return
        if host.name in self._failures:
            raise self._failures[host.name]
        try:
            self._ssh_host(host).transport()
        except DflashError as exc:
            self._failures[host.name] = exc
            raise

    def reset(self, host_name: str) -> None:
        """Forget a remembered connect failure, so the next use tries again (the dashboard's reconnects)."""
        self._failures.pop(host_name, None)

    def host_transport(self, host: HostConfig) -> Transport:
        if host.transport == "local":
            return LocalTransport(host.name)
        self.connect(host)
        return SSHTransport(self._ssh_host(host))

    def for_target(self, target: Target) -> Transport:
        base = self.host_transport(target.host)
        if target.ctid is None:
            return base
        return PctTransport(base, target.ctid, pct_command=target.host.pct, label=target.name)

    def _ssh_host(self, host: HostConfig) -> SSHHost:
        with self._lock:
            conn = self._ssh.get(host.name)
            if conn is None:
                conn = self._ssh[host.name] = SSHHost(host)
            return conn

    def close(self) -> None:
        with self._lock:
            hosts, self._ssh = list(self._ssh.values()), {}
        for conn in hosts:
            conn.close()

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
