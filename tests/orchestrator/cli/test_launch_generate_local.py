"""`dflashctl launch local -- python -m trainer generate --server ...` as a supervised run: the bundled trainer
is deployed for it, and `watch --once --json` and `ps` read its progress line like a step line."""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.lab.workloads import run_cli
from trainer.data.chat_server import send_json

ANSWERED_BEFORE_HOLD = 3


class HoldingEngine(BaseHTTPRequestHandler):
    """Answers the first few prompts, then holds every request until released: a run caught mid-way."""

    protocol_version = "HTTP/1.1"
    answered = 0
    lock = threading.Lock()
    release = threading.Event()

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._send({"data": [{"id": "engine"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            HoldingEngine.answered += 1
            held = HoldingEngine.answered > ANSWERED_BEFORE_HOLD
        if held:
            self.release.wait()
        answer = body["messages"][-1]["content"][::-1]
        self._send({"choices": [{"message": {"content": answer}, "finish_reason": "stop"}],
                    "usage": {"completion_tokens": 50}})

    def _send(self, payload: dict) -> None:
        send_json(self, 200, payload)


@pytest.fixture
def engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), HoldingEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    HoldingEngine.release.set()
    server.shutdown()
    server.server_close()


def test_a_launched_generate_shows_its_progress_in_watch_and_ps(inv, engine, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(10)))
    code, record, err = run_cli(inv, "launch", "local", "--json", "--name", "regen", "--", sys.executable, "-m",
                                "trainer", "generate", "--server", engine, "--prompts", str(prompts), "--output",
                                str(tmp_path / "answers.jsonl"), "--concurrency", "1", "--progress-every", "0",
                                capsys=capsys)
    assert code == 0, err
    deadline = time.monotonic() + 60
    while True:
        code, snapshot, err = run_cli(inv, "watch", "local", "--once", "--json", capsys=capsys)
        run = next(r for r in snapshot["runs"] if r["run_id"] == record["run_id"])
        if run["last_step"] == ANSWERED_BEFORE_HOLD:
            break
        assert time.monotonic() < deadline, (run, err)
        time.sleep(0.2)
    assert run["state"] == "running" and run["phase"] == "generating" and run["tok_per_s"] > 0
    assert run["eta_s"] is not None  # known (not `?`): 7 prompts left at this run's rate, however fast it was
    assert any("generate answered=3/10 failed=0" in line for line in run["log_tail"])
    code, listed, err = run_cli(inv, "ps", "local", "--json", capsys=capsys)
    assert code == 0, err
    mine = [r for r in listed["runs"] if r["run_id"] == record["run_id"]]
    assert mine and mine[0]["last_step"] == ANSWERED_BEFORE_HOLD
    code, _, err = run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)
    assert code == 0, err
