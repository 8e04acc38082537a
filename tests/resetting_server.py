"""A TCP server on loopback that resets every connection (SO_LINGER 0, so the close is an RST) once the client
has sent its SSH banner, optionally after sending the first bytes of its own: what a client meets when sshd drops
it during the banner exchange (the client is then reading the server's banner)."""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SSH_BANNER_START = b"SSH-2.0-Open"  # cut before its end of line: the client is reading the banner when reset


@contextmanager
def resetting_server(first_bytes: bytes = b"") -> Iterator[int]:
    """Listen on 127.0.0.1 (a free port, yielded) until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was closed: the block ended
                return
            conn.settimeout(10)
            try:
                conn.recv(256)  # the client's banner line: it waits for ours now
                if first_bytes:
                    conn.sendall(first_bytes)
            except OSError:
                pass
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def inventory_text(port: int) -> str:
    """An inventory whose one SSH host `h` is that server."""
    return f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {port}\n    connect_timeout: 5\n"
