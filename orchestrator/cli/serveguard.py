"""What keeps `watch --serve` up and its token unguessable in front of textual-serve's routes: a cap on open
connections, a deadline for a connection's first allowed request, a limit on wrong tokens per address, and an
access log that never writes a token.

A connection that has not yet had a request let through (no token, a wrong one, nothing sent at all, half a
request) is a stranger: it is closed REQUEST_WAIT_S after it opened, and at the cap the oldest stranger makes
room for a new connection. Connections that did get in (the dashboard's websocket, its page and files) are never
closed for a stranger; when the cap holds only those, the new connection is refused. The cap sits well under the
process's open-file limit, so a flood of half-open connections leaves the browser tab's own process its pipes. A
burst can still find the server out of files when accepting (asyncio accepts a backlog's worth per turn of the loop
before the guard sees them): asyncio logs that and pauses accepting a second, and the log handler never raises
(never_raising_handler_class), since an exception out of it would end the loop.
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import resource
import time

REQUEST_WAIT_S = 10.0   # a connection's first allowed request comes within this, or it is closed
KEEPALIVE_S = 15.0      # an idle kept-alive connection between two requests
SHUTDOWN_S = 5.0        # what the tabs' sessions get to close once the server stops
MAX_CONNECTIONS = 256
ACCEPT_BACKLOG = 64
# descriptors left for everything but the connections: the interpreter, the event loop, the listening socket,
# what the kernel may hand over in one go (the backlog), and each browser tab's dashboard process's pipes
RESERVED_FILES = 64 + ACCEPT_BACKLOG
WRONG_TOKENS = 5        # wrong tokens an address may give in TOKEN_WINDOW_S; beyond, 429 until the window passes
TOKEN_WINDOW_S = 60.0
TRACKED_ADDRESSES = 4096


def connection_cap(limit: int | None = None) -> int:
    """How many connections may be open at once under the open-file limit (the soft RLIMIT_NOFILE by default):
    half of what is left once RESERVED_FILES are set aside (a tab takes a few more files), at most
    MAX_CONNECTIONS, at least one."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, (limit - RESERVED_FILES) // 2))


class ConnectionGuard:
    """A protocol factory around the web server's: counts the open connections, closes strangers after
    REQUEST_WAIT_S and makes room at the cap by closing the oldest stranger (or refusing the newcomer)."""

    def __init__(self, factory, *, cap: int, wait_s: float = REQUEST_WAIT_S) -> None:
        self._factory, self.cap, self._wait_s = factory, cap, wait_s
        self._open: dict[object, _Watched] = {}   # by transport, oldest first
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Watched(self._factory(), self)

    def let_in(self, transport) -> None:
        """A request on `transport` was let through: its connection is no stranger any more."""
        watched = self._open.get(transport)
        if watched is not None:
            watched.stranger = False

    def _admit(self, watched: _Watched) -> bool:
        if len(self._open) >= self.cap:
            oldest = next((w for w in self._open.values() if w.stranger), None)
            if oldest is None:
                self.refused += 1
                return False
            oldest.close()
        self._open[watched.transport] = watched
        asyncio.get_running_loop().call_later(self._wait_s, self._expire, watched)
        return True

    def _expire(self, watched: _Watched) -> None:
        if watched.stranger and self._open.get(watched.transport) is watched:
            watched.close()

    def _forget(self, watched: _Watched) -> None:
        if self._open.get(watched.transport) is watched:
            del self._open[watched.transport]


class _Watched(asyncio.Protocol):
    """One connection: the web server's own protocol, which sees it only once the guard admitted it."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner, self._guard = inner, guard
        self.transport = None
        self.stranger = True
        self._admitted = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self._guard._admit(self):
            transport.abort()
            return
        self._admitted = True
        self._inner.connection_made(transport)

    def close(self) -> None:
        """Drop the connection at once (no lingering close that would keep its file)."""
        self._guard._forget(self)
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)

    def eof_received(self):
        return self._inner.eof_received() if self._admitted else None

    def connection_lost(self, exc) -> None:
        self._guard._forget(self)
        if self._admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class WrongTokens:
    """Wrong tokens by the address they came from (an IPv6 /64 counting as one address): at most WRONG_TOKENS in
    TOKEN_WINDOW_S each, so a token cannot be guessed at the speed of the network."""

    def __init__(self, *, allowed: int = WRONG_TOKENS, window_s: float = TOKEN_WINDOW_S,
                 clock=time.monotonic) -> None:
        self._allowed, self._window_s, self._clock = allowed, window_s, clock
        self._seen: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()

    def blocked(self, address: str | None) -> bool:
        """Whether `address` gave its share of wrong tokens within the window (even a right one is refused)."""
        times = self._seen.get(_source(address))
        if times is None:
            return False
        self._drop_old(times)
        return len(times) >= self._allowed

    def wrong(self, address: str | None) -> None:
        key = _source(address)
        times = self._seen.pop(key, None) or collections.deque()
        self._drop_old(times)
        times.append(self._clock())
        self._seen[key] = times  # the most recent last: the table forgets the quietest first
        while len(self._seen) > TRACKED_ADDRESSES:
            self._seen.popitem(last=False)

    def _drop_old(self, times: collections.deque) -> None:
        while times and self._clock() - times[0] > self._window_s:
            times.popleft()


def _source(address: str | None) -> str:
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or ""
    if ip.version == 6 and getattr(ip, "ipv4_mapped", None) is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(getattr(ip, "ipv4_mapped", None) or ip)


def never_raising_handler_class(base: type) -> type:
    """A logging handler (a subclass of `base`, rich's RichHandler) whose emit never raises. Drawing a traceback
    opens its frames' source files, which fails at the open-file limit, where a flood of connections has asyncio
    log exactly that (accept out of files, then a second's pause); an exception out of a handler ends the event
    loop, and the server with it. Such a record is written without its traceback, its exception named."""

    class NeverRaising(base):
        def emit(self, record) -> None:
            try:
                super().emit(record)
            except Exception:
                exc = record.exc_info[1] if record.exc_info else None
                record.msg, record.args = record.getMessage() + (f": {exc!r}" if exc is not None else ""), None
                record.exc_info = record.exc_text = None
                try:
                    super().emit(record)
                except Exception:
                    self.handleError(record)

    return NeverRaising


def access_logger_class(base: type) -> type:
    """An aiohttp access logger (a subclass of `base`, its AbstractAccessLogger) that writes the method, the
    path as sent (percent-encoded: no escape code reaches the terminal) and the status: never the query string,
    where the token travels, nor a header, where its cookie does."""

    class PathOnlyAccessLogger(base):
        def log(self, request, response, time) -> None:  # noqa: A002 (aiohttp's name)
            self.logger.info("%s %s %s %.3fs", request.method, request.rel_url.raw_path, response.status, time)

    return PathOnlyAccessLogger
