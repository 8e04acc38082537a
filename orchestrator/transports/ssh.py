"""SSH to a host: one persistent connection per host, shared by every operation on it.

fabric builds the connection (it reads ~/.ssh/config: HostName, Port, User, IdentityFile, ProxyJump, and uses
ssh-agent); paramiko channels run the commands. Host keys are checked against known_hosts with a policy object
(hostkeys.py): an unknown key is refused with instructions unless the inventory opts into `accept-new` for that
host. Connections are set up a few at a time (handshakes.py). Every paramiko and socket error is converted here
into an orchestrator error.
"""
from __future__ import annotations

import logging
import random
import select
import shlex
import socket
import threading
import time
from typing import Sequence

import fabric
import paramiko

from ..errors import AuthError, CommandTimeout, HostKeyError, TransportError, Unreachable
from ..inventory.model import HostConfig
from .base import DEFAULT_TIMEOUT, CommandResult, RemoteProcess, Transport, shown_argv
from .handshakes import handshake_turn
from .hostkeys import UnknownHostKey, install_host_key_checks, known_hosts_path, unknown_key_message
from .remotegroup import (RunningCommands, announced, announced_group, bounded, end_later, ended_by_bound,
                          split_marker, wait_for_endings)
from .sessionslots import SessionSlots
from .shortage import out_of_resources
from .sshchannel import drain, send_input

log = logging.getLogger("dflashctl.ssh")
KEEPALIVE_S = 15
RETRY_FIRST_S = 0.2   # the first backoff after a dropped connection (full jitter: a random wait up to this)...
RETRY_CAP_S = 2.0     # ...doubling up to this
CLOSE_GRACE_S = 1.0   # a streamed command gets this long to end at end of input before it is ended
STDERR_KEPT = 4096    # of a streamed command's stderr (nobody reads it), what is kept: the announced group

# paramiko's transport thread logs what it meets (a reset during the banner: an error and its traceback) to the
# "paramiko" logger. With no handler there, logging's last resort printed that on stderr before dflashctl's own
# one-line error; this handler drops it instead. Records still propagate, so --verbose (a root handler) shows
# them, from warnings up: paramiko's INFO chatter (ciphers, auth steps) is no remote operation of ours.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").setLevel(logging.WARNING)


class SSHHost:
    """The lazily opened, reused connection to one host. Thread-safe; reconnects after a drop."""

    def __init__(self, host: HostConfig) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._conn: fabric.Connection | None = None
        self._extra: list[fabric.Connection] = []  # more connections, once the first carries its server's limit
        self.slots = SessionSlots(host.name)
        self.running = RunningCommands()

    @property
    def label(self) -> str:
        return self.host.name

    def active(self) -> bool:
        """Connected now (never connects: ending what we left on a host must not wait for a dead one)."""
        conn = self._conn
        return conn is not None and conn.transport is not None and conn.transport.is_active()

    def transport(self) -> paramiko.Transport:
        with self._lock:
            return self._transport_locked()

    def _transport_locked(self) -> paramiko.Transport:
        if self._conn is not None and self._conn.transport is not None and self._conn.transport.is_active():
            return self._conn.transport
        self._close_locked()
        self._conn = self._open()
        return self._conn.transport

    def open_session(self) -> paramiko.Channel:
        """A new channel to the host; one refused (sshd's MaxSessions) goes over another connection (sessionslots)."""
        while True:
            transport = self._transport_with_room()
            try:
                channel = transport.open_session(timeout=self.host.connect_timeout)
            except paramiko.SSHException as exc:
                self.slots.refused(transport, exc)  # raises it again unless the server refused this one alone
                continue
            except BaseException:
                self.slots.abandoned(transport)
                raise
            self.slots.opened(transport, channel)
            return channel

    def _transport_with_room(self) -> paramiko.Transport:
        """A connection with room for one more channel, that room claimed (sessionslots)."""
        with self._lock:
            first = self._transport_locked()  # the extra connections that dropped are simply left out
            self._extra = [c for c in self._extra if c.transport is not None and c.transport.is_active()]
            room = self.slots.claim([first, *(c.transport for c in self._extra)])
            if room is None:
                self._extra.append(self._open())
                room = self.slots.claim([self._extra[-1].transport])
            return room

    def close(self, *, end_commands: bool = True) -> None:
        """Close the connection, first ending the commands still running on it (another thread's, given up on;
        sshd would leave them running) and letting the endings under way finish; not on a link found dead."""
        groups = self.running.groups() if end_commands and self.active() else []
        if groups:
            end_later(SSHTransport(self), groups)
        if end_commands:
            wait_for_endings()
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        for conn in [c for c in (self._conn, *self._extra) if c is not None]:
            _close_quietly(conn)
        self._conn, self._extra = None, []
        self.slots.forget_all()

    def _open(self) -> fabric.Connection:
        """Connect; a connection the server drops before its banner or key exchange is made again.

        sshd drops connections at random once more than 10 are being set up (MaxStartups 10:30:100 by default):
        parallel clients, or one watching many targets, meet that as a reset before anything was said. Such an
        attempt is repeated after a random, growing wait until the connect timeout has been spent on attempts and
        waits (the last one at that moment; the waits for a set-up turn do not count); anything else (refused,
        silent, a host key or login problem) fails at once.
        """
        h = self.host
        started, attempt, spent = time.monotonic(), 0, 0.0  # spent: in set-up turns, not waiting for one
        while True:
            attempt += 1
            try:
                with handshake_turn():  # the connect timeout counts within the turn (handshakes.py)
                    began = time.monotonic()
                    try:
                        conn = self._connect()
                    finally:
                        spent += time.monotonic() - began
            except OSError as exc:  # reading fabric's and ssh's config files, before any connection was made
                raise out_of_resources(h.name, exc, "while connecting") or exc
            except _Dropped as exc:
                left = h.connect_timeout - spent
                if left <= 0:
                    raise Unreachable(f"{exc}, {attempt} time(s) in {time.monotonic() - started:.1f}s (is it "
                                      f"refusing new connections while too many are being set up? sshd's "
                                      f"MaxStartups)") from None
                wait = min(left, random.uniform(0, min(RETRY_CAP_S, RETRY_FIRST_S * 2 ** (attempt - 1))))
                spent += wait
                log.info("%s; retrying in %.2fs", exc, wait)
                time.sleep(wait)
                continue
            log.info("connected to %s (%s:%s) in %.0f ms%s", h.name, conn.host, conn.port,
                     (time.monotonic() - started) * 1000, f", attempt {attempt}" if attempt > 1 else "")
            return conn

    def _connect(self) -> fabric.Connection:
        """One connection attempt, its failures converted into orchestrator errors."""
        h = self.host
        kwargs = {"key_filename": [h.identity_file]} if h.identity_file else {}
        conn = fabric.Connection(h.address, user=h.user or _ssh_config_user(h.address) or h.fallback_user,
                                 port=h.port, connect_timeout=h.connect_timeout,
                                 connect_kwargs={**kwargs, "banner_timeout": h.connect_timeout,
                                                 "auth_timeout": h.connect_timeout})
        install_host_key_checks(conn, h)
        try:
            conn.open()
        except UnknownHostKey as exc:
            raise HostKeyError(unknown_key_message(h, conn, exc)) from None
        except paramiko.BadHostKeyException as exc:
            known_hosts = known_hosts_path(conn, h)
            raise HostKeyError(
                f"{h.name}: the host key of {exc.hostname} does NOT match {known_hosts} (offered "
                f"{exc.key.get_name()} {exc.key.fingerprint}). The host was reinstalled or someone is in between; "
                f"check it, then remove the old line with "
                f"`ssh-keygen -f {shlex.quote(known_hosts)} -R {shlex.quote(exc.hostname)}`.") from None
        except paramiko.AuthenticationException as exc:
            raise AuthError(f"{h.name}: authentication failed for {conn.user}@{conn.host}:{conn.port}: {exc}. "
                            f"Check identity_file, ssh-agent or ~/.ssh/config.") from None
        except (socket.timeout, TimeoutError) as exc:
            raise Unreachable(f"{h.name}: no answer from {conn.host}:{conn.port} within "
                              f"{h.connect_timeout:g}s ({exc or 'timed out'})") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            error = _setup_error(h, conn, exc)  # before closing: closing forgets how far the connection came
            _close_quietly(conn)
            raise error from None
        conn.transport.set_keepalive(KEEPALIVE_S)
        if isinstance(conn.transport.sock, socket.socket):  # not through a ProxyJump channel
            # small request/response exchanges; don't let Nagle hold them back
            conn.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn


def _setup_error(h: HostConfig, conn: fabric.Connection, exc: BaseException) -> Unreachable:
    short = out_of_resources(h.name, exc, f"while connecting to {conn.host}:{conn.port}")
    if short is not None:
        return short
    if _closed_during_auth(conn):
        return AuthError(
            f"{h.name}: {conn.host}:{conn.port} closed the connection while {conn.user} was "
            f"authenticating. sshd hangs up after MaxAuthTries refused keys (6 by default), and an "
            f"ssh-agent holding many keys can use them all up before the right one is offered: set "
            f"identity_file for this host in the inventory (that key is offered first).")
    if _dropped_in_setup(exc):
        return _Dropped(f"{h.name}: {conn.host}:{conn.port} closed the connection before the key exchange ended")
    return Unreachable(f"{h.name}: cannot connect to {conn.host}:{conn.port}: {_reason(exc)}")


class _Dropped(Unreachable):
    """The server hung up (or reset) before the key exchange ended: busy, worth another attempt."""


def _dropped_in_setup(exc: BaseException) -> bool:
    """An end of file or a reset while reading the banner or exchanging keys (paramiko wraps the banner's
    in an SSHException, the original kept as its context); a timeout is not one: the host is silent."""
    for cause in (exc, exc.__context__):
        if isinstance(cause, (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
            return True
    return False


def _close_quietly(conn: fabric.Connection) -> None:
    try:
        conn.close()
    except Exception:  # closing a dead or half-open connection must never mask the real error
        pass


def _ssh_config_user(address: str) -> str | None:
    """The User that ~/.ssh/config (or /etc/ssh/ssh_config) gives this host, if any."""
    return fabric.Config().base_ssh_config.lookup(address).get("user")


def _closed_during_auth(conn: fabric.Connection) -> bool:
    """The server finished key exchange, then hung up before authentication succeeded."""
    transport = conn.client.get_transport()
    return transport is not None and transport.initial_kex_done and not transport.is_active()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()})) or "refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class SSHTransport(Transport):
    """Commands on the host itself, through its shared connection."""

    def __init__(self, conn: SSHHost) -> None:
        self.conn = conn
        self.label = conn.label

    def _session(self) -> paramiko.Channel:
        try:
            return self.conn.open_session()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failed(exc, "opening a channel") from None

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT) -> CommandResult:
        argv = tuple(argv)
        started = time.monotonic()
        chan = self._session()
        out, err = bytearray(), bytearray()
        self.conn.running.add(id(chan), err)
        try:
            chan.exec_command(announced(bounded(command_line(argv), timeout)))
            if stdin:
                send_input(chan, stdin, timeout, self.label, argv)
            chan.shutdown_write()
            code = drain(chan, timeout, self.label, argv, out, err)
            if ended_by_bound(code, time.monotonic() - started, timeout):
                raise CommandTimeout(f"{self.label}: unresponsive: {shown_argv(argv)} did not finish in "
                                     f"{timeout:g}s (ended on the host by its bound)")
        except CommandTimeout:
            self.conn.running.done(id(chan))
            self._end(chan, err)  # what we started must not stay behind on the host
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failed(exc, f"running {argv[0]}") from None
        finally:
            self.conn.running.done(id(chan))
            chan.close()
        log.debug("%s: %s -> %d in %.0f ms", self.label, argv[0], code, (time.monotonic() - started) * 1000)
        return CommandResult(argv, code, bytes(out), split_marker(bytes(err))[1])

    def start(self, argv: Sequence[str]) -> RemoteProcess:
        chan = self._session()
        try:
            chan.exec_command(announced(command_line(argv)))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failed(exc, f"starting {argv[0]}") from None
        return SSHProcess(chan, self)

    def _failed(self, exc: BaseException, doing: str) -> Unreachable:
        """The error for a failure while `doing`: dflashctl short of file descriptors (the connection is fine and
        stays open, for the other commands on it: shortage.py), else the connection dropped (closed; the next
        command makes it again)."""
        short = out_of_resources(self.label, exc, f"while {doing}")
        if short is not None:
            return short
        self.conn.close(end_commands=False)
        return Unreachable(f"{self.label}: the connection dropped while {doing}: {_reason(exc)}")

    def _end(self, chan: paramiko.Channel, err: bytearray) -> None:
        """End a command we gave up on: its process group, as it announced it, on a second channel."""
        pgid = announced_group(chan, err)
        if pgid is not None and not chan.exit_status_ready() and self.conn.active():
            end_later(self, [pgid])  # in the background: a dead link must not hold the caller


def command_line(argv: Sequence[str]) -> bytes:
    """argv quoted for the remote shell, as bytes: an argument that is not UTF-8 (`$'\\xff'`, which Python
    holds as a lone surrogate) reaches the host as the very bytes that were typed, as it does locally."""
    return shlex.join(argv).encode("utf-8", "surrogateescape")


class SSHProcess(RemoteProcess):
    def __init__(self, chan: paramiko.Channel, transport: SSHTransport) -> None:
        self._chan = chan
        self._transport = transport
        self._label = transport.label
        self._err = bytearray()  # the start of stderr: where the command announced its process group

    def read(self, timeout: float | None = None) -> bytes:
        """The next chunk of stdout. The channel's fileno also wakes for stderr, which is taken aside here: a
        recv() woken by stderr alone would block until stdout spoke, past any timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._chan.recv_ready() and not self._chan.eof_received:
                while self._chan.recv_stderr_ready():
                    chunk = self._chan.recv_stderr(65536)
                    self._err += chunk[:max(0, STDERR_KEPT - len(self._err))]
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CommandTimeout(f"{self._label}: no output in {timeout:g}s")
                select.select([self._chan], [], [], left)
            return self._chan.recv(65536)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise out_of_resources(self._label, exc, "while reading") or \
                Unreachable(f"{self._label}: the connection dropped: {_reason(exc)}") from None

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self._label}: cannot send to the command: {_reason(exc)}") from None

    def close_stdin(self) -> None:
        self._chan.shutdown_write()

    def poll(self) -> int | None:
        return self._chan.recv_exit_status() if self._chan.exit_status_ready() else None

    def close(self) -> None:
        """Close the channel, ending the command first if it still runs (a quiet `tail -F` would otherwise stay
        on the host until it next writes, a hung one forever)."""
        if not self._chan.closed and not self._chan.exit_status_ready():
            self._chan.shutdown_write()  # most commands (the watch agent) end on their own at end of input...
            if not self._chan.status_event.wait(CLOSE_GRACE_S):
                self._transport._end(self._chan, self._err)  # ...the others (tail -F, a hung one) are ended
        self._chan.close()
