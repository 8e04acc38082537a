"""A notification sink for tests: an HTTP server on 127.0.0.1 that keeps every JSON body apprise's `json://`
plugin posts to it (title, message, type), and can be told to hang or to refuse with a status."""
from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass

from tests import polling


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() on arrival
    path: str
    title: str
    message: str
    type: str


class NotifySink:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.status = 200
        self.hang = threading.Event()  # set: requests wait (until released) before any answer
        self._released = threading.Event()
        self._changed = threading.Condition()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if sink.hang.is_set():
                    sink._released.wait(30)
                with sink._changed:
                    sink.received.append(Received(time.monotonic(), self.path, body.get("title", ""),
                                                  body.get("message", ""), body.get("type", "")))
                    sink._changed.notify_all()
                self.send_response(sink.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def wait_for(self, predicate, timeout: float) -> list[Received]:
        """The messages once `predicate(messages)` holds (tried again at each arrival); AssertionError with what
        came otherwise."""
        def held() -> list[Received] | None:
            with self._changed:
                got = list(self.received)
            return got if predicate(got) else None

        return polling.wait_for(held, timeout, 0.2, pause=self._arrival, what=lambda: f"received: {self.received}")

    def _arrival(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def about(self, run_id: str) -> list[Received]:
        return [r for r in self.received if run_id in r.message]

    def __enter__(self) -> "NotifySink":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
