"""A minimal OpenAI-compatible server of a target, greedy, on top of transformers: the engine `generate
--server` talks to in tests and the CPU benchmark, where vLLM and SGLang cannot run. One answer at a time,
unbatched; `/v1/models` and `/v1/chat/completions` only. Not for real jobs: serve those with an engine.

`python -m trainer.data.chat_server --target DIR [--port 0]` prints `serving NAME on http://HOST:PORT` and serves.
"""
from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 name: str | None = None) -> None:
        from trainer.data.generate import load_target_for_generation, pick_device

        self.model, self.tokenizer = load_target_for_generation(target, pick_device("cpu"))
        self.name = name or Path(target).name
        self.lock = threading.Lock()  # one forward pass at a time: a CPU box has no room for more
        self.answered = 0
        self.hold_after: int | None = None  # tests: answer this many, then hold every later request
        self.release = threading.Event()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, list[int]]:
        from trainer.data.generate import _answer_batch

        with self.lock:
            held = self.hold_after is not None and self.answered >= self.hold_after
        if held:
            self.release.wait()
        with self.lock:
            [(text, ids)] = _answer_batch(self.model, self.tokenizer, [messages], max_tokens)
            self.answered += 1
        return text, ids


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet: tests read stderr
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.name, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            self._send(400, {"error": {"message": "the body is not JSON"}})
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}"}})
        elif body.get("model") != self.server.name:
            self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        elif float(body.get("temperature", 1.0)) != 0.0:
            self._send(400, {"error": {"message": "this server answers greedily only (temperature 0)"}})
        else:
            self._complete(body)

    def _complete(self, body: dict) -> None:
        max_tokens = int(body.get("max_tokens") or 512)
        text, ids = self.server.answer(body["messages"], max_tokens)
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length" if len(ids) >= max_tokens else "stop"}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        self._send(200, {"object": "chat.completion", "model": self.server.name, "choices": [choice],
                         "usage": {"completion_tokens": len(ids)}})

    def _send(self, status: int, payload: dict) -> None:
        send_json(self, status, payload)


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
    """One JSON reply on a kept-alive HTTP/1.1 connection (the length said, so the client knows its end)."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data.chat_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="target model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--name", help="the model's served name (default: the directory's name)")
    args = parser.parse_args(argv)
    server = ChatServer(args.target, host=args.host, port=args.port, name=args.name)
    print(f"serving {server.name} on {server.url}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
