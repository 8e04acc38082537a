"""An HTTP server on loopback that answers slowly on purpose: every reply to a request for one of `drip_paths`
goes out one byte every `interval` seconds (a valid reply, were it ever finished), the others at once. What a
client meets from an overloaded engine or a proxy that trickles: each read gets a byte well within any socket
timeout, so only a deadline on the whole request ends it. Bounded: a drip stops when the block ends, when the
client goes away, or when its reply is out."""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class DrippingServer:
    url: str
    requests: list[str] = field(default_factory=list)  # "METHOD PATH" of each request, as it came


@contextmanager
def dripping_server(replies: dict[str, dict], *, drip_paths: tuple[str, ...],
                    interval: float = 0.3) -> Iterator[DrippingServer]:
    """Serve `replies` (path -> JSON object) on 127.0.0.1 (a free port) until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()
    server = DrippingServer(url=f"http://127.0.0.1:{listener.getsockname()[1]}")

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was closed: the block ended
                return
            threading.Thread(target=_answer, args=(conn, server, replies, drip_paths, interval, stop),
                             daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def _answer(conn: socket.socket, server: DrippingServer, replies: dict[str, dict], drip_paths: tuple[str, ...],
            interval: float, stop: threading.Event) -> None:
    with conn:
        conn.settimeout(10)
        try:
            method, path = _read_request(conn)
        except (OSError, ValueError):
            return
        server.requests.append(f"{method} {path}")
        body = json.dumps(replies.get(path, {"error": {"message": "no such path"}})).encode()
        status = "200 OK" if path in replies else "404 Not Found"
        reply = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n").encode() + body
        if not path.startswith(drip_paths):
            conn.sendall(reply)
            return
        for index in range(len(reply)):
            if stop.wait(interval):
                return
            try:
                conn.sendall(reply[index:index + 1])
            except OSError:  # the client gave up
                return


def _read_request(conn: socket.socket) -> tuple[str, str]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("the client went away")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")),
                  0)
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("the client went away")
        body += chunk
    method, path, _ = lines[0].split(" ", 2)
    return method, path
