"""A TCP server on loopback that resets every connection (SO_LINGER 0, so the close is an RST) once the client
has sent its SSH banner, optionally after sending the first bytes of its own: what a client meets when sshd drops
it during the banner exchange (the client is then reading the server's banner), as sshd does at random past its
MaxStartups. With `resets` and `then_relay_to`, only the first `resets` connections are reset and the later ones
are relayed to a real sshd: a busy server that lets a client in at a later attempt."""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SSH_BANNER_START = b"SSH-2.0-Open"  # cut before its end of line: the client is reading the banner when reset


@contextmanager
def resetting_server(first_bytes: bytes = b"", *, resets: int | None = None,
                     then_relay_to: tuple[str, int] | None = None) -> Iterator[int]:
    """Listen on 127.0.0.1 (a free port, yielded) until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        accepted = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was closed: the block ended
                return
            accepted += 1
            if then_relay_to is not None and resets is not None and accepted > resets:
                threading.Thread(target=_relay, args=(conn, then_relay_to), daemon=True).start()
            else:
                _reset(conn, first_bytes)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def _reset(conn: socket.socket, first_bytes: bytes) -> None:
    conn.settimeout(10)
    try:
        conn.recv(256)  # the client's banner line: it waits for ours now
        if first_bytes:
            conn.sendall(first_bytes)
    except OSError:
        pass
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _relay(conn: socket.socket, upstream_address: tuple[str, int]) -> None:
    with conn, socket.create_connection(upstream_address, timeout=10) as upstream:
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join(10)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def inventory_text(port: int) -> str:
    """An inventory whose one SSH host `h` is that server (a reset is tried again until the connect timeout has
    passed: a short one keeps the tests short)."""
    return f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {port}\n    connect_timeout: 2\n"
