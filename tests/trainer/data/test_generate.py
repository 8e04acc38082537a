"""`python -m trainer generate` as a real process: the local path and `--server` against real servers on
loopback (the tiny target behind trainer/data/chat_server.py, and a stand-in that answers 429, 500 and drops
connections), resume after SIGKILL with a torn last line, the failed file and the exit codes."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO_ROOT, run_trainer, trainer_env, write_prompts
from trainer.data.chat_server import send_json

TOKENS = "12"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_index(path: Path) -> dict[int, dict]:
    records = _records(path)
    indices = [r["index"] for r in records]
    assert len(indices) == len(set(indices)), f"an index answered twice: {sorted(indices)}"
    return {r["index"]: r for r in records}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("generate") / "prompts.jsonl", 6, seed=3)


@pytest.fixture(scope="module")
def local_answers(tiny_target, prompts, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("local") / "answers.jsonl"
    done = run_trainer("generate", "--target", tiny_target, "--prompts", prompts, "--output", output,
                       "--max-new-tokens", TOKENS, "--device", "cpu", "--batch-size", "4")
    assert done.returncode == 0, done.stderr
    return output


@pytest.fixture()
def chat_server(tiny_target):
    from trainer.data.chat_server import ChatServer

    server = ChatServer(tiny_target, name="tiny")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_local_path_writes_indexed_records_and_resumes_after_a_torn_line(local_answers, prompts, tiny_target,
                                                                         tmp_path):
    first = _by_index(local_answers)
    assert sorted(first) == list(range(6))
    assert all(len(r["completion_token_ids"]) <= int(TOKENS) and r["messages"][-1]["role"] == "assistant"
               for r in first.values())
    output = tmp_path / "answers.jsonl"
    text = local_answers.read_text()
    output.write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])  # the last line cut mid-way
    torn_index = _records(local_answers)[-1]["index"]
    again = run_trainer("generate", "--target", tiny_target, "--prompts", prompts, "--output", output,
                        "--max-new-tokens", TOKENS, "--device", "cpu", "--json")
    assert again.returncode == 0, again.stderr
    assert "skipping 5 prompts already answered" in again.stderr and "cut off" in again.stderr
    summary = json.loads(again.stdout)
    assert (summary["answered"], summary["skipped"], summary["failed"], summary["torn_line_redone"]) == (1, 5, 0,
                                                                                                        True)
    redone = _by_index(output)
    assert sorted(redone) == list(range(6))
    assert redone[torn_index]["completion_token_ids"] == first[torn_index]["completion_token_ids"]


def test_server_answers_equal_the_local_answers_token_for_token(chat_server, local_answers, prompts, tmp_path):
    output = tmp_path / "served.jsonl"
    done = run_trainer("generate", "--server", chat_server.url, "--prompts", prompts, "--output", output,
                       "--max-new-tokens", TOKENS, "--concurrency", "3", "--progress-every", "0")
    assert done.returncode == 0, done.stderr
    assert "generate answered=6/6 failed=0" in done.stderr
    from dflash_records.run import RunRecord
    from orchestrator.watch.trackers import RunTracker  # the dashboard reads the real progress lines

    watched = RunTracker("local", RunRecord(run_id="g", state="running"), history=10, tail=10)
    watched.feed(0, 1, done.stderr.encode(), now=0.0)
    view = watched.view()
    assert (view.phase, view.last_step, view.eta_s) == ("generating", 6, 0.0) and view.tok_per_s > 0
    served, local = _by_index(output), _by_index(local_answers)
    assert sorted(served) == list(range(6))
    for index, record in served.items():
        # the server returned the ids it generated (vLLM's return_token_ids); the text must agree too
        assert record["completion_token_ids"] == local[index]["completion_token_ids"], index
        assert record["messages"] == local[index]["messages"]


def test_a_model_the_server_does_not_serve_is_one_error_line(chat_server, prompts, tmp_path):
    done = run_trainer("generate", "--server", chat_server.url, "--model", "Qwen/Qwen3-8B", "--prompts", prompts,
                       "--output", tmp_path / "out.jsonl")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: server {chat_server.url}/v1 does not serve model 'Qwen/Qwen3-8B'; it serves 'tiny'"]


def test_sigkill_mid_way_then_rerun_answers_every_prompt_once(chat_server, prompts, local_answers, tmp_path):
    output = tmp_path / "answers.jsonl"
    chat_server.hold_after = 3
    command = [sys.executable, "-m", "trainer", "generate", "--server", chat_server.url, "--prompts", str(prompts),
               "--output", str(output), "--max-new-tokens", TOKENS, "--concurrency", "1"]
    process = subprocess.Popen(command, env=trainer_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (output.exists() and output.read_text().count("\n") >= 3):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    # what a kill in the middle of a write leaves: the last record cut short, no newline
    text = output.read_text()
    output.write_text(text[:-len(text.splitlines()[-1]) // 2])
    chat_server.hold_after = None
    chat_server.release.set()
    again = run_trainer("generate", "--server", chat_server.url, "--prompts", prompts, "--output", output,
                        "--max-new-tokens", TOKENS, "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert (summary["skipped"], summary["answered"], summary["torn_line_redone"]) == (2, 4, True)
    answers, local = _by_index(output), _by_index(local_answers)
    assert sorted(answers) == list(range(6))
    assert all(answers[i]["completion_token_ids"] == local[i]["completion_token_ids"] for i in answers)


class StandInEngine(BaseHTTPRequestHandler):
    """A stand-in engine: answers a prompt by its words, after the faults its content asks for. A prompt that
    starts with "hang" is never answered the first time it is asked (until the server's `release` is set)."""

    protocol_version = "HTTP/1.1"
    attempts: dict[str, int] = {}
    lock = threading.Lock()

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"data": [{"id": "stand-in"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        with self.lock:
            attempt = self.attempts[prompt] = self.attempts.get(prompt, 0) + 1
        if prompt.startswith("hang") and attempt == 1:
            self.server.release.wait()  # type: ignore[attr-defined]
            self.close_connection = True
        elif prompt == "drop" and attempt == 1:
            self.connection.shutdown(2)  # the connection goes away without an answer
            self.close_connection = True
        elif prompt == "busy" and attempt <= 2:
            self._send(429, {"error": {"message": "too many requests"}})
        elif prompt == "crash" and attempt == 1:
            self._send(500, {"error": {"message": "engine hiccup"}})
        elif prompt == "always500":
            self._send(500, {"error": {"message": "engine down"}})
        elif prompt == "too long":
            self._send(400, {"error": {"message": "prompt longer than the context"}})
        else:
            self._send(200, {"choices": [{"message": {"content": prompt.upper()}, "finish_reason": "stop"}],
                             "usage": {"completion_tokens": len(prompt.split())}})

    def _send(self, status: int, payload: dict) -> None:
        send_json(self, status, payload)


def test_retries_and_permanent_failures_leave_every_prompt_answered_or_failed_once(tmp_path):
    contents = ["fine", "drop", "busy", "crash", "always500", "too long", "also fine"]
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": c}) for c in contents]
    lines.insert(3, "{not json")
    prompts.write_text("\n".join(lines) + "\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        output = tmp_path / "answers.jsonl"
        done = run_trainer("generate", "--server", f"http://127.0.0.1:{server.server_address[1]}", "--prompts",
                           prompts, "--output", output, "--retries", "3", "--retry-wait", "0.01",
                           "--concurrency", "4", "--json")
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1, done.stderr
    answered = _by_index(output)
    failed = {r["index"]: r["reason"] for r in _records(tmp_path / "answers.failed.jsonl")}
    assert len(failed) == len(_records(tmp_path / "answers.failed.jsonl"))
    assert not set(answered) & set(failed) and set(answered) | set(failed) == set(range(8))
    assert {answered[i]["messages"][-1]["content"] for i in answered} == {
        "FINE", "DROP", "BUSY", "CRASH", "ALSO FINE"}
    assert "invalid JSON" in failed[3] and "HTTP 500: engine down" in failed[5]
    assert "gave up after 4 attempts" in failed[5] and "HTTP 400: prompt longer" in failed[6]
    assert json.loads(done.stdout)["failed"] == 3


def test_requests_that_hang_are_asked_again_after_the_request_timeout(tmp_path):
    # 3 of 12 requests hang forever at first: with the old 600 s wait the run stalled; now each is given up after
    # --request-timeout and asked again like a failed one
    contents = [f"hang {i}" for i in range(3)] + [f"fine {i}" for i in range(9)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c}) + "\n" for c in contents))
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInEngine)
    server.release = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        output = tmp_path / "answers.jsonl"
        done = run_trainer("generate", "--server", f"http://127.0.0.1:{server.server_address[1]}", "--prompts",
                           prompts, "--output", output, "--request-timeout", "1", "--retry-wait", "0.01",
                           "--concurrency", "4", "--json", timeout=120)
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    answered = _by_index(output)
    assert sorted(answered) == list(range(12))
    assert [answered[i]["messages"][-1]["content"] for i in range(12)] == [c.upper() for c in contents]
    assert all(StandInEngine.attempts[c] == 2 for c in contents[:3])
    assert json.loads(done.stdout)["failed"] == 0
    assert elapsed < 60  # a second per hung request and the process's start, not 600 s


def test_the_default_request_timeout_leaves_room_for_the_longest_answer_asked_for():
    from trainer.data.chat_client import default_request_timeout

    assert default_request_timeout(512) == 120.0  # an answer the engine sends whole, once all of it is decoded
    assert default_request_timeout(4096) == pytest.approx(409.6)  # the regeneration recipe: 4096 tokens at 10 tok/s


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "soon"])
def test_a_request_timeout_that_is_no_duration_is_one_usage_line(value, tmp_path):
    done = run_trainer("generate", "--server", "http://127.0.0.1:9", "--prompts", tmp_path / "p.jsonl",
                       "--output", tmp_path / "out.jsonl", f"--request-timeout={value}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: --request-timeout {value!r}: give a number of seconds above 0, e.g. 120"]


def test_prepare_reads_the_output_as_it_is(local_answers, tiny_target, tmp_path):
    import datasets

    from trainer.data.prepare import prepare

    lines = local_answers.read_text().splitlines(keepends=True)
    in_order = tmp_path / "in_order.jsonl"
    in_order.write_text("".join(sorted(lines, key=lambda line: json.loads(line)["index"])))
    as_written = tmp_path / "as_written.jsonl"  # finished out of order, and a record half-written at the end
    as_written.write_text("".join(reversed(lines)) + lines[0][:len(lines[0]) // 2])
    first = prepare(target=tiny_target, input_path=in_order, output=tmp_path / "a", block_size=4)
    second = prepare(target=tiny_target, input_path=as_written, output=tmp_path / "b", block_size=4)
    assert (first.kept, second.kept, first.torn_last_line, second.torn_last_line) == (6, 6, False, True)
    rows = [sorted(map(tuple, datasets.load_from_disk(str(tmp_path / name))["input_ids"])) for name in "ab"]
    assert rows[0] == rows[1]
    answers = [json.loads(line)["completion_token_ids"] for line in lines]
    # the target's own answer ids are kept as generate wrote them, not re-tokenized from the text
    assert all(any(tuple(ids) == row[i:i + len(ids)] for row in rows[0] for i in range(len(row)))
               for ids in answers)


def test_the_benchmark_prints_both_paths_rates():
    done = subprocess.run([sys.executable, "bench/bench_generate.py", "--prompts", "2", "--max-new-tokens", "4",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300, env=trainer_env(),
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [row[0] for row in rows] == ["local", "--server"]
    assert all(row[row.index("prompts") - 1] == "2" and row[row.index("tokens") - 1] == "8" for row in rows)


def test_resume_appends_only_to_its_own_records(tmp_path):
    from trainer.data.answer_files import resume_output
    from trainer.errors import TrainerError

    ours = tmp_path / "ours.jsonl"
    ours.write_text('{"index": 4, "messages": []}\n{"index": 1, "messages": []}\n{"index": 2, "mess')
    resumed = resume_output(ours)
    assert (resumed.answered, resumed.torn) == ({1, 4}, True)
    assert ours.read_text().endswith('{"index": 1, "messages": []}\n')
    for name, text in (("old.jsonl", '{"messages": []}\n'), ("middle.jsonl", '{"index": 0}\n{"ind\n{"index": 1}\n')):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(TrainerError, match="refusing to append to it"):
            resume_output(path)
        assert path.read_text() == text  # nothing cut from a file that is not ours


ENGINE_REPLIES = {"/v1/models": {"data": [{"id": "slow"}]},
                  "/v1/chat/completions": {"choices": [{"message": {"content": "a long time coming"},
                                                        "finish_reason": "stop"}],
                                           "usage": {"completion_tokens": 4}}}


def test_a_server_that_drips_its_answers_is_given_up_at_the_request_deadline_and_asked_again(tmp_path):
    # one byte every 0.3 s: each read is well within any socket timeout, so only a deadline on the whole
    # request ends it (before, such a request stalled the run for as long as the server kept dripping)
    from tests.dripping_server import dripping_server

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(2)))
    output = tmp_path / "answers.jsonl"
    with dripping_server(ENGINE_REPLIES, drip_paths=("/v1/chat/",)) as server:
        done = run_trainer("generate", "--server", server.url, "--prompts", prompts, "--output", output,
                           "--request-timeout", "1.5", "--retries", "1", "--retry-wait", "0.01", "--json",
                           timeout=90)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    failed = _records(tmp_path / "answers.failed.jsonl")
    assert sorted(record["index"] for record in failed) == [0, 1]
    assert {record["reason"] for record in failed} == {
        f"gave up after 2 attempts: POST {server.url}/v1/chat/completions: no whole answer within the request "
        f"deadline of 1.5s (--request-timeout)"}
    assert server.requests.count("POST /v1/chat/completions") == 4  # the retry policy applies: each asked twice
    assert json.loads(done.stdout)["failed"] == 2


def test_a_server_that_drips_even_its_model_list_is_one_error_line_naming_it_and_the_deadline(tmp_path):
    from tests.dripping_server import dripping_server

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    with dripping_server(ENGINE_REPLIES, drip_paths=("/v1/",)) as server:
        done = run_trainer("generate", "--server", server.url, "--prompts", prompts, "--output",
                           tmp_path / "answers.jsonl", "--request-timeout", "1", "--retries", "1",
                           "--retry-wait", "0.01", timeout=90)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: server {server.url}/v1: cannot list its models: gave up after 2 attempts: GET {server.url}/v1/models: "
        f"no whole answer within the request deadline of 1s (--request-timeout)"]
    assert server.requests == ["GET /v1/models"] * 2
