"""Keys and OpenSSH servers of the lab: one real `sshd -D` per fake host, inside the host's namespace."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from tests.polling import wait_for

SSHD = "/usr/sbin/sshd"


class SshdError(RuntimeError):
    """An sshd of the lab did not come up."""


def generate_key(path: Path, comment: str) -> Path:
    """An ed25519 key pair without passphrase; returns the private key's path."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True,
    )
    return path


def known_hosts_line(address: str, port: int, host_key_pub: Path) -> str:
    key_type, key_b64 = host_key_pub.read_text().split()[:2]
    where = address if port == 22 else f"[{address}]:{port}"
    return f"{where} {key_type} {key_b64}\n"


def write_config(
    path: Path, *, address: str, port: int, host_key: Path, authorized_keys: Path,
    pid_file: Path, set_env: dict[str, str], max_sessions: int = 100,
) -> Path:
    # MaxStartups stays at OpenSSH's default (10:30:100), as on a Proxmox host: past 10 connections in set-up
    # sshd drops new ones at random, which parallel clients must ride out
    env = " ".join(f"{key}={value}" for key, value in set_env.items())
    path.write_text(
        f"""# sshd of one fake Proxmox host of the test lab
ListenAddress {address}
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
LogLevel VERBOSE
MaxSessions {max_sessions}
SetEnv {env}
Subsystem sftp internal-sftp
"""
    )
    return path


def start(netns: str, config: Path, log: Path, *, binds: tuple[tuple[Path, str], ...] = ()) -> subprocess.Popen[bytes]:
    """sshd in `netns`; `binds` (source, mount point) are bind-mounted first in the mount namespace `ip netns
    exec` makes for it, so its sessions (and only they) see them: a fake host's /proc/driver, /proc/devices."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    # `ip netns exec` and then sh exec sshd in place, so the pid we get is sshd's own. Should the test process
    # die without tearing down, the next lab's start removes what is left (lab.reap_stale_labs).
    mounts = "".join(f'mount --bind "${2 * i + 1}" "${2 * i + 2}" && ' for i in range(len(binds)))
    argv = ["sh", "-c", f'{mounts}shift {2 * len(binds)} && exec "$@"', "sh",
            *(str(part) for pair in binds for part in pair)] if binds else []
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, *argv, SSHD, "-D", "-f", str(config), "-E", str(log)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_accepting(proc: subprocess.Popen[bytes], address: str, port: int, log: Path,
                   *, timeout: float = 10.0) -> None:
    def accepting() -> bool:
        if proc.poll() is not None:
            raise SshdError(f"sshd exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection((address, port), timeout=0.5) as sock:
                sock.settimeout(2)
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    if not wait_for(accepting, timeout):
        raise SshdError(f"sshd on {address}:{port} did not accept connections in {timeout}s: {_tail(log)}")


def stop(proc: subprocess.Popen[bytes], *, grace: float = 2.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return "(no log)"


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
