"""An OpenAI-compatible chat-completions client for `generate --server`: vLLM, SGLang, `transformers serve` or
any other server that speaks `/v1/chat/completions`. Standard library only (urllib and threads): one request
per prompt, at most `concurrency` in flight, retries with exponential backoff on 429, 5xx, dropped or refused
connections and requests the server left unanswered past the request timeout; any other answer is a permanent
failure of that prompt, with the server's reason. The request timeout bounds each request whole (connecting,
waiting, reading the answer), not each read of its socket: a server that drips its answer a byte at a time never
lets a socket timeout fire, so each request carries a deadline that shuts its socket when it passes.

Greedy by default (temperature 0); the server applies the target's own chat template. `return_token_ids` asks
the server for the answer's token ids (vLLM returns them as `choices[0].token_ids`); a server that has none
gives text only, which `prepare` tokenizes.
"""
from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from trainer.errors import TrainerError

RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT_S = 120.0
SLOWEST_TOK_PER_S = 10.0  # a busy engine still decodes each answer at least this fast


def default_request_timeout(max_new_tokens: int) -> float:
    """How long a request may go unanswered: 120 s, or what the longest answer asked for takes at 10 tok/s."""
    return max(REQUEST_TIMEOUT_S, max_new_tokens / SLOWEST_TOK_PER_S)


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: list[int] | None
    completion_tokens: int
    finish_reason: str | None


class PermanentFailure(Exception):
    """This prompt will not be answered by asking again; the message says why."""


class ServerClient:
    def __init__(self, url: str, *, model: str | None = None, concurrency: int = 8, max_new_tokens: int = 512,
                 retries: int = 6, retry_wait_s: float = 1.0, timeout_s: float | None = None) -> None:
        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.concurrency = max(1, concurrency)
        self.max_new_tokens = max_new_tokens
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self.timeout_s = default_request_timeout(max_new_tokens) if timeout_s is None else timeout_s
        self.model = self._served_model(model)

    # -- the model

    def _served_model(self, wanted: str | None) -> str:
        try:
            listing = self._with_retries(lambda: self._request("GET", "/models", None))
        except PermanentFailure as exc:
            raise TrainerError(f"server {self.base}: cannot list its models: {exc}") from None
        served = [entry.get("id") for entry in listing.get("data", []) if isinstance(entry, dict)]
        if wanted is None:
            if len(served) != 1:
                raise TrainerError(f"server {self.base} serves {_names(served)}: pick one with --model")
            return served[0]
        if wanted not in served:
            raise TrainerError(f"server {self.base} does not serve model {wanted!r}; it serves {_names(served)}")
        return wanted

    # -- answering

    def answer_all(self, prompts: Iterable[tuple[int, list[dict[str, str]]]]
                   ) -> Iterator[tuple[int, Answer | PermanentFailure]]:
        """(index, Answer or PermanentFailure) as each finishes; prompts are read only as slots free up."""
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="chat") as pool:
            running: dict[Future, int] = {}
            source = iter(prompts)
            exhausted = False
            while running or not exhausted:
                while not exhausted and len(running) < 2 * self.concurrency:  # a queue keeps every slot busy
                    item = next(source, None)
                    if item is None:
                        exhausted = True
                        break
                    running[pool.submit(self._answer_one, item[1])] = item[0]
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    index = running.pop(future)
                    error = future.exception()
                    if error is not None and not isinstance(error, PermanentFailure):
                        error = PermanentFailure(f"{type(error).__name__}: {error}")
                    yield index, error if error is not None else future.result()

    def _answer_one(self, messages: list[dict[str, str]]) -> Answer:
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_new_tokens,
                "temperature": 0.0, "return_token_ids": True}
        reply = self._with_retries(lambda: self._request("POST", "/chat/completions", body))
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise PermanentFailure(f"the server's reply has no answer: {json.dumps(reply)[:300]}") from None
        token_ids = choice.get("token_ids")
        token_ids = token_ids if isinstance(token_ids, list) else None
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        tokens = usage.get("completion_tokens", len(token_ids) if token_ids is not None else 0)
        return Answer(text, token_ids, int(tokens or 0), choice.get("finish_reason"))

    # -- HTTP

    def _with_retries(self, call):
        for attempt in range(self.retries + 1):
            try:
                return call()
            except _Retry as exc:
                if attempt == self.retries:
                    raise PermanentFailure(f"gave up after {self.retries + 1} attempts: {exc}") from None
                time.sleep(exc.wait_s if exc.wait_s is not None else self.retry_wait_s * 2 ** attempt)
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, body: dict | None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        late = _Retry(f"{method} {self.base}{path}: no whole answer within the request deadline of "
                      f"{self.timeout_s:g}s (--request-timeout)", None)
        with _Deadline(self.timeout_s) as deadline:
            try:
                with deadline.opener().open(request, timeout=self.timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code in RETRIED_STATUS:
                    raise _Retry(f"HTTP {exc.code}: {detail}", _retry_after(exc)) from None
                raise PermanentFailure(f"HTTP {exc.code}: {detail}") from None
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                    OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                if deadline.expired or isinstance(reason, TimeoutError):  # TimeoutError: silent for timeout_s
                    raise late from None
                raise _Retry(f"connection: {reason}", None) from None
        if deadline.expired:  # the socket was shut mid-answer: what was read is not the whole answer
            raise late
        try:
            return json.loads(payload)
        except ValueError:
            raise _Retry(f"a reply that is not JSON: {payload[:200]!r}", None) from None


class _Retry(Exception):
    def __init__(self, message: str, wait_s: float | None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class _Deadline:
    """One request's whole time. When it passes, every socket the request opened is shut down, which wakes a
    read blocked on a server that drips its answer (each byte well within the socket timeout, so that never
    fires) and ends the request with an error; `expired` then says why."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        self._timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._timer.cancel()

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener (proxies from the environment included) whose connections this deadline watches."""
        return urllib.request.build_opener(_WatchedHTTPHandler(self), _WatchedHTTPSHandler(self))

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or a plain socket a TLS one took over
        pass


class _Watched:
    """An http.client connection whose sockets its deadline watches: the plain one from the moment it connects
    (a TLS handshake can drip too), then the TLS one that takes it over."""

    def __init__(self, *args, deadline: _Deadline, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        create = self._create_connection
        self._create_connection = lambda *a, **k: deadline.watch(create(*a, **k))

    def connect(self) -> None:
        super().connect()
        self.deadline.watch(self.sock)


class _WatchedHTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(_WatchedHTTPConnection, deadline=self.deadline), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        options = {"context": self._context}
        if hasattr(self, "_check_hostname"):  # Python < 3.12
            options["check_hostname"] = self._check_hostname
        return self.do_open(functools.partial(_WatchedHTTPSConnection, deadline=self.deadline), req, **options)


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    value = error.headers.get("Retry-After") if error.headers else None
    try:
        return min(60.0, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None


def _error_detail(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return error.reason or ""
    try:
        message = json.loads(text).get("error", {})
        message = message.get("message", message) if isinstance(message, dict) else message
        return str(message)[:300]
    except (ValueError, AttributeError):
        return text[:300] or str(error.reason)


def _names(served: list) -> str:
    return ", ".join(repr(name) for name in served) if served else "no models"
