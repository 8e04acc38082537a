"""Host keys of SSH hosts: checked against known_hosts with a policy object (OpenSSH's StrictHostKeyChecking=yes,
or accept-new where the inventory opts in), and the messages that say what to do about an unknown key."""
from __future__ import annotations

import logging
import os
import shlex

import fabric
import paramiko

from ..errors import HostKeyError
from ..inventory.model import HostConfig
from .shortage import out_of_resources

log = logging.getLogger("dflashctl.ssh")


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} not found in known_hosts")
        self.hostname = hostname
        self.key = key


class RejectUnknownHostKey(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=yes, keeping the offered key so the error can show its fingerprint."""

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko's signature
        raise UnknownHostKey(hostname, key)


class AcceptNewHostKey(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: trust a new host once and remember it; a changed key still fails."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.known_hosts) or ".", exist_ok=True)
        with open(self.known_hosts, "a", encoding="ascii") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("added the host key of %s to %s", hostname, self.known_hosts)


def policy_for(host: HostConfig, known_hosts: str) -> paramiko.MissingHostKeyPolicy:
    return AcceptNewHostKey(known_hosts) if host.host_key_policy == "accept-new" else RejectUnknownHostKey()


def known_hosts_path(conn: fabric.Connection, host: HostConfig) -> str:
    """The known_hosts file checked for this host: the inventory's, else ~/.ssh/config's, else the default."""
    known_hosts = host.known_hosts or conn.ssh_config.get("userknownhostsfile", "").split(" ")[0] \
        or "~/.ssh/known_hosts"
    return os.path.expanduser(known_hosts)


def install_host_key_checks(conn: fabric.Connection, host: HostConfig) -> None:
    """fabric trusts every host key by default; put known_hosts and a strict policy in place (gateways too)."""
    known_hosts = known_hosts_path(conn, host)
    client = paramiko.SSHClient()
    if os.path.exists(known_hosts):
        try:
            client.load_host_keys(known_hosts)
        except (OSError, paramiko.SSHException) as exc:
            raise out_of_resources(host.name, exc, f"reading {known_hosts}") or \
                HostKeyError(f"{host.name}: cannot read known_hosts {known_hosts}: {exc}") from None
    client.set_missing_host_key_policy(policy_for(host, known_hosts))
    conn.client = client
    if isinstance(conn.gateway, fabric.Connection):
        install_host_key_checks(conn.gateway, host)


def unknown_key_message(host: HostConfig, conn: fabric.Connection, exc: UnknownHostKey) -> str:
    key = exc.key
    address = shlex.quote(conn.host)
    target = f"-p {conn.port} {address}" if conn.port and conn.port != 22 else address
    where = shlex.quote(known_hosts_path(conn, host))
    return (f"{host.name}: unknown host key for {exc.hostname} ({key.get_name()} {key.fingerprint}); refusing to "
            f"connect. If that fingerprint is right, accept it with `ssh-keyscan {target} >> {where}` (or connect "
            f"once with ssh), or set `host_key_policy: accept-new` for this host in the inventory.")
