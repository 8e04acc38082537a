"""`dflashctl watch --serve`: the same dashboard in a browser, through textual-serve (the `serve` extra).

textual-serve starts the given command once per browser tab, with Textual's web driver, and relays its screen
and keys over a websocket. The command is this dflashctl's own `watch` with the inventory and targets the
server was started with, so the browser shows exactly what the terminal would, and its kill and cleanup keys
ask the same confirmations.

Access: loopback only by default. On any other address a token is required (given with --token, or made up
and printed with the URL). The token is checked in front of every route, page and websocket alike: the page
accepts it as `?token=` and sets it as a same-site cookie, which the page's own websocket and static files
carry. A websocket opened by another site's page (its Origin names another host) is refused on any address,
loopback too: it would otherwise drive the dashboard's kill key from a browser that merely visits that site.
Every request, page, websocket and static file alike, must also name this server in its Host header (the bound
port, and the bound address or a name of it: loopback's names on a loopback bind, this machine's names and the
address the connection reached otherwise): a site whose own name its DNS points at this machine (DNS rebinding)
is the same origin as itself to the browser, so only the Host it sends gives it away.
In front of all that (serveguard.py): a cap on connections with a deadline for a stranger's first request, a
limit on wrong tokens per address, and an access log that never writes a token.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import secrets
import shlex
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import EXIT_OK, UsageError
from ..inventory.model import find_inventory
from .serveguard import (ACCEPT_BACKLOG, KEEPALIVE_S, SHUTDOWN_S, ConnectionGuard, WrongTokens,
                         access_logger_class, connection_cap, never_raising_handler_class)

INSTALL_HINT = "pip install 'dflashctl[serve]'"
TOKEN_COOKIE = "dflashctl_token"
REFUSED = "dflashctl watch --serve: this dashboard needs its token: open the URL it printed (?token=...)\n"
TOO_MANY = "dflashctl watch --serve: too many wrong tokens from this address: wait a minute\n"
MIN_TOKEN_CHARS = 16
WRONG_HOST = "dflashctl watch --serve: the request's Host is not this server's address: open the URL it printed\n"
WILDCARDS = ("0.0.0.0", "::", "")
HOST_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-:[]")
LOOPBACK_NAMES = ("localhost", "ip6-localhost", "ip6-loopback")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (a name other than localhost counts as reachable)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_token(host: str, token: str | None) -> str | None:
    """The token the server will require: the given one, a new one off loopback, none on loopback."""
    if token is not None:
        if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
            raise UsageError(f"--token: use at least {MIN_TOKEN_CHARS} printable characters without spaces "
                             "(or leave it out: one is made up)")
        return token
    return None if is_loopback(host) else secrets.token_urlsafe(18)


def served_command(inventory: Path | None, targets: list[str], interval: float) -> str:
    """The shell command textual-serve runs per browser tab: this Python's dflashctl, same inventory and targets."""
    argv = [sys.executable, "-m", "orchestrator"]
    if inventory is not None:
        argv += ["--inventory", str(inventory.resolve())]
    argv += ["watch", *targets, "--interval", repr(interval), "--no-notify"]   # one notifier, not one per tab
    return shlex.join(argv)


def page_url(host: str, port: int, token: str | None) -> str:
    """The URL to open: the address bound (this machine's name for a wildcard bind), with the token."""
    shown = (machine_name() or host or "0.0.0.0") if host in WILDCARDS else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def machine_name() -> str:
    """This machine's name as other machines may know it: its full name, else its host name where the full one is
    loopback's (a hosts file that maps the host name to 127.0.0.1 makes getfqdn() say `localhost`); "" when
    both are."""
    for name in (socket.getfqdn(), socket.gethostname()):
        if name and name.split(".")[0].lower() not in LOOPBACK_NAMES:
            return name
    return ""


def bind_note(host: str) -> str:
    """What a wildcard bind means, for the line that gives the URL."""
    if host not in WILDCARDS:
        return ""
    return (f"listening on every address of this machine ({host or '0.0.0.0'}): any name or address other "
            "machines reach it by works in the URL; ")


def token_ok(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def served_names(host: str) -> frozenset[str]:
    """The names (addresses aside) a request may give as its Host for a server bound to `host`: loopback's on a
    loopback bind; otherwise this machine's names, with the bound one, or loopback's on a wildcard bind (which
    loopback reaches too)."""
    if is_loopback(host):
        names = {"localhost", host}
    else:
        names = {socket.gethostname(), socket.getfqdn(), "localhost" if host in WILDCARDS else host}
    return frozenset(name.lower().rstrip(".") for name in names if _address(name) is None)


def host_ok(header: str | None, *, bound: str, port: int, names: frozenset[str], reached: str | None) -> bool:
    """Whether a request's Host header names this server: the bound port, and one of `names`, the bound address,
    the address the connection reached (`reached`), or any loopback address on a loopback or wildcard bind."""
    header = (header or "").lower()
    if not header or not set(header) <= HOST_CHARACTERS:
        return False
    try:
        parts = urlsplit(f"//{header}")
        name, given_port = parts.hostname, parts.port or 80
    except ValueError:  # a port that is no number, a bracket left open
        return False
    if not name or given_port != port:
        return False
    address = _address(name)
    if address is None:
        return name.rstrip(".") in names
    if address.is_loopback and (is_loopback(bound) or bound in WILDCARDS):
        return True
    return address in (_address(bound), _address(reached or ""))


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `text` spells (an IPv4 one for an IPv4-mapped IPv6 address), or None for a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def same_origin(origin: str | None, host: str | None) -> bool:
    """A websocket handshake's Origin against the Host it was sent to; a client that sends no Origin (not a
    browser page) passes."""
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == (host or "").lower()


def serve(command: str, *, host: str, port: int, token: str | None, title: str, show_token: bool = True) -> int:
    """Serve `command` until interrupted (Ctrl-C or SIGTERM); the line that says where names the token only
    with `show_token` (one made up, which nobody knows yet)."""
    try:
        from aiohttp import web
        from aiohttp.abc import AbstractAccessLogger
        from textual_serve.server import Server
    except ImportError:
        raise UsageError(f"watch --serve needs textual-serve, which is not installed: {INSTALL_HINT}") from None
    server = _server_class(Server, web, AbstractAccessLogger)(command, host=host, port=port, title=title)
    server.token = token
    server.url, server.note = page_url(host, port, token if show_token else None), bind_note(host)
    if token and not show_token:
        server.url, server.note = server.url + "?token=...", server.note + "with the token given to --token; "
    server.names = served_names(host)
    server.wrong_tokens = WrongTokens()
    server.serve()
    return EXIT_OK


def _server_class(server_base: type, web, access_logger_base: type):
    """textual-serve's Server with the Host, origin and token checks in front of every route."""

    class TokenServer(server_base):
        token: str | None = None
        url = ""
        note = ""
        names: frozenset[str] = frozenset()
        guard: ConnectionGuard
        wrong_tokens: WrongTokens

        async def _make_app(self):
            app = await super()._make_app()
            app.middlewares.append(_checks(self, web))
            return app

        async def handle_index(self, request):
            # the page's websocket goes back to the address the browser used, not to the bound one
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

        def initialize_logging(self) -> None:
            """textual-serve's log lines, with tracebacks that never show their frames' variables: a failed
            request's would show the token the checks held; a line that cannot be drawn never ends the server."""
            from rich.logging import RichHandler

            handler = never_raising_handler_class(RichHandler)
            logging.basicConfig(level="DEBUG" if self.debug else "INFO", format="%(message)s", handlers=[
                handler(show_path=False, show_time=False, rich_tracebacks=True, tracebacks_show_locals=False,
                        console=self.console)])

        async def on_startup(self, app) -> None:
            """Quiet: the line that says where to point a browser comes once the socket listens (serve)."""

        def serve(self, debug: bool = False) -> None:
            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            stopping = asyncio.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stopping.set)
            try:
                loop.run_until_complete(_listen(self, web, access_logger_base, stopping))
            finally:
                loop.close()

        def _listening(self) -> None:
            print(f"dflashctl: serving the dashboard on {self.url} ({self.note}Ctrl-C stops it)", file=sys.stderr,
                  flush=True)

    return TokenServer


def _checks(server, web):
    """The middleware in front of every route: the Host, the websocket's origin, the token (and its cookie)."""
    @web.middleware
    async def guard(request, handler):
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if not host_ok(request.headers.get("Host"), bound=server.host, port=server.port, names=server.names,
                       reached=sockname[0] if sockname else None):
            return web.Response(status=403, text=WRONG_HOST)
        if request.path == "/ws" and not same_origin(request.headers.get("Origin"), request.host):
            return web.Response(status=403, text="dflashctl watch --serve: a websocket from another "
                                                 "site is refused\n")
        given = request.query.get("token")
        if server.token:
            refused = token_refusal(request, given, server.token, server.wrong_tokens)
            if refused:
                return web.Response(status=refused[0], text=refused[1])
        server.guard.let_in(request.transport)
        response = await handler(request)
        if server.token and given and request.path == "/":
            response.set_cookie(TOKEN_COOKIE, server.token, httponly=True, samesite="Strict")
        return response

    return guard


def token_refusal(request, given: str | None, token: str, wrong_tokens: WrongTokens) -> tuple[int, str] | None:
    """(status, text) when the request's token (in the query or the cookie) does not let it in; a wrong one
    counts against its address, which is refused for a while after WRONG_TOKENS of them."""
    address = request.remote
    if wrong_tokens.blocked(address):
        return 429, TOO_MANY
    cookie = request.cookies.get(TOKEN_COOKIE)
    if token_ok(given, token) or token_ok(cookie, token):
        return None
    if given is not None or cookie is not None:
        wrong_tokens.wrong(address)
    return 403, REFUSED


async def _listen(server, web, access_logger_base: type, stopping: asyncio.Event) -> None:
    """Serve through the connection guard until `stopping` is set, then close every tab's session: aiohttp's
    runner by hand, since run_app has no place for the guard."""
    runner = web.AppRunner(await server._make_app(), handle_signals=False, keepalive_timeout=KEEPALIVE_S,
                           access_log_class=access_logger_class(access_logger_base), shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    try:
        server.guard = ConnectionGuard(runner.server, cap=connection_cap())
        try:
            listener = await asyncio.get_running_loop().create_server(
                server.guard, server.host or None, server.port, reuse_address=True, backlog=ACCEPT_BACKLOG)
        except OSError as exc:  # the port is taken, the address is not this machine's; nothing later is a usage error
            raise UsageError(f"watch --serve cannot listen on {server.host}:{server.port}: "
                             f"{exc.strerror or exc}") from None
        server._listening()
        await stopping.wait()
        listener.close()
    finally:
        await runner.cleanup()


def serve_dashboard(state, targets: list[str], interval: float, *, once: bool, host: str, port: int,
                    token: str | None) -> int:
    """`watch --serve`: check the options, then serve this inventory's dashboard for `targets`."""
    if once:
        raise UsageError("--serve and --once do not go together (--once prints one snapshot here)")
    required = choose_token(host, token)  # a made-up one is in the URL the server prints when it listens
    inventory = find_inventory(state.inventory_path)
    return serve(served_command(inventory, targets, interval), host=host, port=port, token=required,
                 title="dflashctl watch", show_token=token is None)
