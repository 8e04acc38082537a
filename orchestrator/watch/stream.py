"""One container's watch stream: a thread that has the run client start `agent watch` over the host's shared
connection, hands every message to the source, and reconnects with exponential backoff when it is lost."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from dflash_records.watchwire import WatchMessage, decode_message

from ..errors import CommandTimeout, DflashError, TransportError, Unreachable
from ..inventory.model import Target
from ..runs.agentcall import needs_deploy
from ..runs.client import RunClient
from ..runs.spec import runs_dir
from ..transports.base import RemoteProcess, Transport
from ..transports.pct import PctTransport
from ..transports.ssh import SSHTransport

log = logging.getLogger("dflashctl.watch")

BACKOFF_FIRST_S = 1.0
BACKOFF_CAP_S = 30.0
READ_TICK_S = 1.0
PING_EVERY_S = 10.0
AGENT_IDLE_EXIT_S = 60.0  # the agent's own limit: a controller behind a dead link never closes its stdin
STEADY_S = 30.0  # a session that lasted this long starts the next backoff from the beginning
SILENCE_CAP_S = AGENT_IDLE_EXIT_S  # past this the agent has given up on us anyway
# an agent's first message may wait for a deploy and a Python start on a loaded machine; counted from the later of
# the stream's start and the last first word any stream of the source heard: a fleet that is still coming up
# (the controller's 2 cores starting 128 agents) is slow, not gone
FIRST_WORD_S = 45.0
STARTS_AT_ONCE = 16  # streams between their start and their first word at one time (see ContainerStream._session)
ONCE_WAIT_S = FIRST_WORD_S + 15.0  # `watch --once` waits no shorter than a stream for the first word, plus a connect
ONCE_CAP_FACTOR = 5  # ...while targets keep answering, up to this many times its wait in all


class StreamSink(Protocol):
    """What the stream reports to (the live source); called from the stream's thread."""

    def connected(self, target: Target) -> dict[str, object]: ...   # -> follow offsets to resume from
    def message(self, target: Target, message: WatchMessage) -> dict[str, object] | None: ...  # -> new follows
    def tick(self, target: Target) -> None: ...
    def disconnected(self, target: Target, error: str, retry_at: float) -> None: ...
    def reconnecting(self, target: Target) -> None: ...  # the backoff is over; a new attempt begins


def drop_connection(transport: Transport) -> None:
    """Close the SSH connection under a transport: a link that went silent is dead for every container."""
    base = transport.host if isinstance(transport, PctTransport) else transport
    if isinstance(base, SSHTransport):
        base.conn.close(end_commands=False)  # nothing can be ended over it


class HostActivity:
    """When each host last sent anything on any of its streams: one container's silent agent (stopped, or
    starved on a loaded machine) says nothing about the link, as long as a sibling's stream still speaks."""

    def __init__(self) -> None:
        self._heard: dict[str, float] = {}
        self._first_word = float("-inf")  # the last time any stream heard its agent's first word
        self._lock = threading.Lock()

    def heard(self, host: str, now: float, *, first: bool = False) -> None:
        with self._lock:
            self._heard[host] = now
            if first:
                self._first_word = now

    def first_word_overdue(self, started: float, now: float) -> bool:
        """A stream started at `started` has waited too long for its first word: FIRST_WORD_S since it started
        and since any stream last heard a first word (progress of the fleet, not the wall clock)."""
        with self._lock:
            return now - max(started, self._first_word) > FIRST_WORD_S

    def silent_for(self, host: str, now: float) -> float:
        with self._lock:
            return now - self._heard.get(host, float("-inf"))


@dataclass
class StreamOptions:
    gpu_interval: float = 1.0
    heartbeat_s: float = 5.0
    activity: HostActivity = field(default_factory=HostActivity)  # shared by the streams of one source
    # shared too: how many streams may be between their start and their first word at once
    starting: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(STARTS_AT_ONCE))

    @property
    def silence_limit_s(self) -> float:
        return 3 * self.heartbeat_s + 1.0


def silence_limit(options: StreamOptions, worst_gap_s: float) -> float:
    """How long a stream may stay silent before it counts as lost: three heartbeats, or three times the worst
    gap this session has already survived (a loaded machine delivers heartbeats late, not never)."""
    return min(SILENCE_CAP_S, max(options.silence_limit_s, 3 * worst_gap_s))


class ContainerStream:
    def __init__(self, target: Target, client: RunClient, sink: StreamSink, options: StreamOptions) -> None:
        self.target = target
        self.client = client
        self.conns = client.conns
        self.sink = sink
        self.options = options
        self._stop = threading.Event()
        self._proc: RemoteProcess | None = None
        self._starting = False  # holds one of options.starting
        self._thread = threading.Thread(target=self._run, name=f"watch {target.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the stream to end without waiting for it: the agent's stdin is closed (it ends at end of input)
        and the stream's own thread closes the command, so a fleet's streams all end at once (join waits)."""
        self._stop.set()
        proc = self._proc
        if proc is not None:
            try:
                proc.close_stdin()
            except (DflashError, OSError, EOFError):
                pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # -- the loop

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                error = self._session()
            except DflashError as exc:
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 - a bug in one stream must not end the dashboard
                log.debug("%s: watch stream failed", self.target.name, exc_info=True)  # not over the TUI
                error = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            failures = 1 if time.monotonic() - started > STEADY_S else failures + 1
            delay = min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** (failures - 1))
            reason = reason_only(error, self.target.name, self.target.host.name)
            self.sink.disconnected(self.target, reason, time.time() + delay)
            self._stop.wait(delay)
            self.conns.reset(self.target.host.name)
            if not self._stop.is_set():
                self.sink.reconnecting(self.target)

    def _session(self) -> str:
        """One connection of the stream. Starts take turns (STARTS_AT_ONCE): a fleet's agents all starting at
        once on a small controller starve each other past any first-word limit, while a few at a time each
        answer in their own time and the fleet's progress shows; a turn lasts until the first word."""
        while not self.options.starting.acquire(timeout=READ_TICK_S):
            if self._stop.is_set():
                return "stopped"
        self._starting = True
        try:
            return self._attempts()
        finally:
            self._started()

    def _started(self) -> None:
        if self._starting:
            self._starting = False
            self.options.starting.release()

    def _attempts(self) -> str:
        transport = self.conns.for_target(self.target)
        for attempt in range(2):  # a second time only after sending the agent the first start found missing
            if attempt:
                self.client.redeploy(self.target)
            self._proc = proc = self.client.start_agent(self.target, [
                "watch", "--runs-dir", runs_dir(self.target), "--gpu-interval", f"{self.options.gpu_interval:g}",
                "--heartbeat", f"{self.options.heartbeat_s:g}", "--idle-exit", f"{AGENT_IDLE_EXIT_S:g}"])
            try:
                self._follow(proc)
                return self._pump(proc, transport)
            except _NeedsDeploy:
                pass
            finally:
                self._proc = None
                proc.close()
        return "the watch agent is still not there right after it was sent"

    def _follow(self, proc: RemoteProcess) -> None:
        """The offsets to resume from; a start that already answered NEEDS_DEPLOY may have stopped listening,
        which its answer (read next) says better than a failed send."""
        try:
            self._send(proc, {"follow": self.sink.connected(self.target)})
        except TransportError:
            pass

    def _pump(self, proc: RemoteProcess, transport: Transport) -> str:
        buffer = b""
        last_data = last_tick = last_ping = started = time.monotonic()
        worst_gap, heard = 0.0, False
        host, activity = self.target.host.name, self.options.activity
        while not self._stop.is_set():
            try:
                chunk = proc.read(READ_TICK_S)
            except CommandTimeout:
                chunk = None
            now = time.monotonic()
            if chunk == b"":
                return "the watch agent ended" + _exit_note(proc)
            if chunk:
                worst_gap = max(worst_gap, now - last_data) if heard else worst_gap
                activity.heard(host, now, first=not heard)
                last_data, heard = now, True
                self._started()
                *lines, buffer = (buffer + chunk).split(b"\n")
                self._dispatch(proc, lines)
            elif (now - last_data > silence_limit(self.options, worst_gap) if heard
                  else activity.first_word_overdue(started, now)):
                self._silent(transport, now - last_data, activity.silent_for(host, now))
            if now - last_tick >= READ_TICK_S:
                last_tick = now
                self.sink.tick(self.target)
            if now - last_ping >= PING_EVERY_S:
                last_ping = now
                self._send(proc, {"ping": 1})
        return "stopped"

    def _silent(self, transport: Transport, silent_s: float, host_silent_s: float) -> None:
        """This stream is lost; the host's connection too only when none of its streams spoke meanwhile."""
        if host_silent_s >= silent_s:
            drop_connection(transport)
            raise Unreachable(f"{self.target.name}: no word from the watch agent for {silent_s:.0f}s "
                              f"(connection lost)")
        raise Unreachable(f"{self.target.name}: no word from the watch agent for {silent_s:.0f}s while the "
                          f"host's other streams speak (the agent is stuck; restarting it)")

    def _dispatch(self, proc: RemoteProcess, lines: list[bytes]) -> None:
        """Each line read once, into its typed message (dflash_records.watchwire), which is what the sink gets."""
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # e.g. a warning the container's Python printed; the stream goes on
            if isinstance(obj, dict) and needs_deploy(obj):
                raise _NeedsDeploy()
            message = decode_message(obj)
            if message is None:
                continue  # not a message, or a kind this version does not know
            follow = self.sink.message(self.target, message)
            if follow:
                self._send(proc, {"follow": follow})

    @staticmethod
    def _send(proc: RemoteProcess, command: dict) -> None:
        proc.write((json.dumps(command) + "\n").encode())


class _NeedsDeploy(TransportError):
    """The stream's start found this version of the agent missing (agentcall.needs_deploy)."""


def reason_only(error: str, *names: str) -> str:
    """The error without the `NAME: ` a transport error starts with: whoever shows it names the target already
    (`dead: cannot connect ...`, not `dead: dead: cannot connect ...`)."""
    for name in names:
        if error.startswith(f"{name}: "):
            error = error[len(name) + 2:]
    return error


def _exit_note(proc: RemoteProcess) -> str:
    code = proc.poll()
    return "" if code is None else f" (exit code {code})"

