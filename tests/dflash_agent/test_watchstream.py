"""The in-container watch agent and the `lines` index, run as real processes on local run directories."""
from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_agent import lineindex, queuestore, watchstream
from dflash_records.watchwire import RunsMessage
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]
ENTRY = "import sys; from dflash_agent.cli import main; sys.exit(main(sys.argv[1:]))"
FAKE_SMI = """#!{python}
import sys, time, json
state = {state!r}
loop = [a for a in sys.argv if a.startswith("--loop=")]
while True:
    for row in json.load(open(state)):
        print(", ".join(str(v) for v in row))
    sys.stdout.flush()
    if not loop:
        break
    time.sleep(float(loop[0].split("=")[1]))
"""


class Agent:
    """`agent watch` in a subprocess; its JSON lines collected by a reader thread."""

    def __init__(self, runs_dir: Path, *, env: dict | None = None, args: tuple = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", ENTRY, "watch", "--runs-dir", str(runs_dir),
                                      "--gpu-interval", "1", *args], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.messages: queue.Queue = queue.Queue()
        self.seen: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))

    def send(self, command: dict) -> None:
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()

    def expect(self, predicate, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(message)
            if predicate(message):
                return message
        raise AssertionError(f"no matching message in {timeout}s; saw {[m.get('t') for m in self.seen[-20:]]}")

    def log_bytes(self, run_id: str, until: int, timeout: float = 5.0) -> bytes:
        """Concatenated log data for run_id until the stream reached byte `until`; offsets must be contiguous."""
        data, end = b"", None
        while end is None or end < until:
            message = self.expect(lambda m: m.get("t") == "log" and m["run"] == run_id, timeout)
            assert end is None or message["offset"] == end, "a gap or an overlap in the stream"
            chunk = base64.b64decode(message["data"])
            data, end = data + chunk, message["offset"] + len(chunk)
        return data

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=5)


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


STAND_INS: list = []


@pytest.fixture(autouse=True)
def _end_stand_ins():
    yield
    while STAND_INS:
        proc = STAND_INS.pop()
        proc.kill()
        proc.wait()


def stand_in_supervisor(runs: Path, run_id: str) -> dict:
    """A live process the agent takes for the run's supervisor (its `supervise` command line, its start time
    recorded): what keeps a `running` run from being settled as lost. Ended after the test."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "supervise", "--runs-dir",
                             str(runs.resolve()), "--run-id", run_id])
    STAND_INS.append(proc)
    read = lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # noqa: E731
    assert wait_for(lambda: b"supervise" in read(), 5)
    start = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return {"supervisor_pid": proc.pid, "supervisor_start_time": start}


def make_run(runs: Path, run_id: str, *, state: dict | None = None, log: bytes = b"") -> Path:
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "name": run_id, "target": "local"}))
    write_state(run_dir, state or dict(state="running", **stand_in_supervisor(runs, run_id)))
    (run_dir / "train.log").write_bytes(log)
    return run_dir


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / ".state.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, run_dir / "state.json")


def no_gpu_env(tmp_path: Path) -> dict:
    return {**os.environ, "PATH": str(tmp_path / "empty-bin") + ":/usr/bin:/bin"}


def test_follow_from_offset_tail_and_resume_without_loss(runs: Path, tmp_path: Path) -> None:
    lines = b"".join(b"line %d\n" % i for i in range(40000))  # > 256 KiB
    run_dir = make_run(runs, "r1", log=lines)
    agent = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        agent.expect(lambda m: m.get("t") == "runs" and [r["run_id"] for r in m["runs"]] == ["r1"])
        agent.send({"follow": {"r1": -1}})
        first = agent.expect(lambda m: m.get("t") == "log")
        start = first["offset"]
        assert 0 < len(lines) - start <= watchstream.TAIL_BYTES and lines[start - 1:start] == b"\n"
        agent.expect(lambda m: m.get("t") == "synced" and m["runs"] == ["r1"])
        # resume from a byte in the middle of a line: exactly the rest comes, nothing before it
        agent.send({"follow": {"r1": 100}})
        assert agent.log_bytes("r1", len(lines)) == lines[100:]
        with (run_dir / "train.log").open("ab") as log:
            log.write(b"appended\n")
        assert agent.log_bytes("r1", len(lines) + 9) == b"appended\n"
    finally:
        assert agent.close() == 0


def test_truncated_or_replaced_log_is_reset(runs: Path, tmp_path: Path) -> None:
    run_dir = make_run(runs, "r1", log=b"one\ntwo\n")
    agent = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        agent.send({"follow": {"r1": 0}})
        assert agent.log_bytes("r1", 8) == b"one\ntwo\n"
        (run_dir / "train.log").write_bytes(b"x\n")  # truncated in place
        assert agent.expect(lambda m: m.get("t") == "reset")["size"] == 2
        assert agent.log_bytes("r1", 2) == b"x\n"
        replacement = run_dir / "new.log"
        replacement.write_bytes(b"abc\n")  # same size class, new inode: only the inode tells
        os.replace(replacement, run_dir / "train.log")
        agent.expect(lambda m: m.get("t") == "reset")
        assert agent.log_bytes("r1", 4) == b"abc\n"
    finally:
        agent.close()


def test_runs_records_follow_state_changes(runs: Path, tmp_path: Path) -> None:
    run_dir = make_run(runs, "r1")
    agent = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        first = agent.expect(lambda m: m.get("t") == "runs")
        assert first["runs"][0]["state"] == "running"
        write_state(run_dir, {"state": "succeeded", "exit_code": 0})
        changed = agent.expect(lambda m: m.get("t") == "runs")
        assert (changed["runs"][0]["state"], changed["runs"][0]["exit_code"]) == ("succeeded", 0)
        make_run(runs, "r2", state={"state": "running", "supervisor_pid": 999999999})  # a dead supervisor
        both = agent.expect(lambda m: m.get("t") == "runs" and len(m["runs"]) == 2)
        assert {r["run_id"]: r["state"] for r in both["runs"]} == {"r1": "succeeded", "r2": "lost"}
    finally:
        agent.close()


def test_queued_runs_carry_their_place_and_a_change_of_the_queue_alone_resends_them(runs: Path) -> None:
    """A queued run's record has its place (1: next), as ps gives it; a row leaving the queue changes every place
    behind it, and the stream resends the records though no state.json changed (the poll, run in-process: a
    watch process would start a keeper for the queue)."""
    for run_id in ("q1", "q2", "q3"):
        make_run(runs, run_id, state={"state": "queued", "queued_at": "2026-05-01T12:00:00.000Z"})
        queuestore.enqueue(str(runs), run_id, queued_at="2026-05-01T12:00:00.000Z", gpus=None, gpu_count=1)
    sent: list = []
    watcher = watchstream.RunsWatcher(str(runs), SimpleNamespace(send=sent.append))

    def places() -> dict:
        newest = [message for message in sent if isinstance(message, RunsMessage)][-1]
        return {record.run_id: record.queue_position for record in newest.runs}
    watcher.poll(0.0)
    assert places() == {"q1": 1, "q2": 2, "q3": 3}
    queuestore.remove(str(runs), "q2")
    watcher.poll(1.0)
    assert places() == {"q1": 1, "q2": None, "q3": 2}
    count = len(sent)
    watcher.poll(2.0)
    assert len(sent) == count  # nothing changed: nothing resent


def fake_smi_env(tmp_path: Path) -> tuple[dict, Path]:
    bin_dir, state = tmp_path / "bin", tmp_path / "gpus.json"
    bin_dir.mkdir()
    state.write_text(json.dumps([[0, "GPU-a", "H200", 100, 143771, 5], [1, "GPU-b", "H200", 200, 143771, 6]]))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, state=str(state)))
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, state


def test_gpu_samples_from_one_looping_nvidia_smi_which_dies_with_the_agent(runs: Path, tmp_path: Path) -> None:
    env, state = fake_smi_env(tmp_path)
    runs.mkdir()
    agent = Agent(runs, env=env)
    try:
        sample = agent.expect(lambda m: m.get("t") == "gpu")
        assert sample["csv"].splitlines() == ["0, GPU-a, H200, 100, 143771, 5", "1, GPU-b, H200, 200, 143771, 6"]
        (tmp_path / "next.json").write_text(json.dumps([[0, "GPU-a", "H200", 9000, 143771, 97]]))
        os.replace(tmp_path / "next.json", state)  # atomically: the fake reads it at any moment
        agent.expect(lambda m: m.get("t") == "gpu" and m.get("csv") == "0, GPU-a, H200, 9000, 143771, 97")
        children = child_pids(agent.proc.pid)
        assert len(children) == 1
    finally:
        assert agent.close() == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in children), "nvidia-smi outlived the agent"


def test_sigterm_also_ends_nvidia_smi(runs: Path, tmp_path: Path) -> None:
    env, _ = fake_smi_env(tmp_path)
    runs.mkdir()
    agent = Agent(runs, env=env)
    agent.expect(lambda m: m.get("t") == "gpu")
    children = child_pids(agent.proc.pid)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=5) == 128 + signal.SIGTERM
    assert children and not any(Path(f"/proc/{pid}").exists() for pid in children)


def test_without_nvidia_smi_one_error_and_heartbeats(runs: Path, tmp_path: Path) -> None:
    runs.mkdir()
    agent = Agent(runs, env=no_gpu_env(tmp_path), args=("--heartbeat", "0.3"))
    try:
        assert "not installed" in agent.expect(lambda m: m.get("t") == "gpu")["error"]
        agent.expect(lambda m: m.get("t") == "hb")
        agent.expect(lambda m: m.get("t") == "hb")
        assert [m for m in agent.seen if m.get("t") == "gpu"] == [{"t": "gpu", "error": "nvidia-smi is not installed"}]
    finally:
        assert agent.close() == 0


def child_pids(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except (OSError, ValueError):
            continue
        if name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(name))
    return found


# ---------------------------------------------------------------------------------------------- lines

def run_lines(runs: Path, run_id: str, start: int, stop: int) -> dict:
    done = subprocess.run([sys.executable, "-c", ENTRY, "lines", "--runs-dir", str(runs), "--run-id", run_id,
                           "--start", str(start), "--stop", str(stop)], cwd=REPO, capture_output=True, check=True)
    return json.loads(done.stdout)


def test_lines_at_start_middle_end_and_after_appends(runs: Path) -> None:
    text = [f"line {i} " + "x" * (i % 50) for i in range(5500)]
    run_dir = make_run(runs, "r1", log="".join(t + "\n" for t in text).encode())
    answer = run_lines(runs, "r1", 0, 3)
    assert (answer["total"], answer["lines"]) == (5500, text[:3])
    assert run_lines(runs, "r1", 2998, 3003)["lines"] == text[2998:3003]
    assert run_lines(runs, "r1", 5497, 5600)["lines"] == text[5497:]
    index = json.loads((run_dir / lineindex.INDEX_NAME).read_text())
    assert index["marks"][3] == sum(len(t) + 1 for t in text[:3000])
    with (run_dir / "train.log").open("ab") as log:
        log.write(b"tail a\ntail b\npartial\r\x1b[31mredrawn")
    answer = run_lines(runs, "r1", 5499, 5510)
    assert answer["total"] == 5503
    assert answer["lines"] == [text[5499], "tail a", "tail b", "redrawn"]
    (run_dir / "train.log").write_bytes(b"fresh\n")  # replaced: the index starts over
    assert run_lines(runs, "r1", 0, 10)["lines"] == ["fresh"]


def test_line_index_extends_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"a\n" * 2500)
    index = lineindex.LineIndex()
    with path.open("rb") as handle:
        index.extend(handle, 1, 5000)
        assert (index.lines, index.marks) == (2500, [0, 2000, 4000])
        with path.open("ab") as log:
            log.write(b"b\n" * 600)
        index.extend(handle, 1, 6200)
    assert (index.lines, index.marks) == (3100, [0, 2000, 4000, 6000])


def test_metrics_jsonl_is_sent_beside_the_log_in_whole_lines_and_resumes(runs: Path, tmp_path: Path) -> None:
    run_dir = make_run(runs, "r1", log=b"step line\n")
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "metrics.jsonl"  # the bundled trainer's file, linked from the run directory
    target.write_bytes(b'{"event": "step", "step": 1}\n{"event": "step", "st')
    (run_dir / "metrics.jsonl").symlink_to(target)

    def metrics(agent: Agent) -> dict:
        return agent.expect(lambda m: m.get("t") == "metrics" and m["run"] == "r1")

    agent = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        agent.send({"follow": {"r1": -1}})
        first = metrics(agent)  # only the whole line: the second is still being written
        assert (first["offset"], base64.b64decode(first["data"])) == (0, b'{"event": "step", "step": 1}\n')
        agent.expect(lambda m: m.get("t") == "synced" and m["runs"] == ["r1"])
        with target.open("ab") as handle:
            handle.write(b'ep": 2}\n')
        second = metrics(agent)
        assert (second["offset"], base64.b64decode(second["data"])) == (29, b'{"event": "step", "step": 2}\n')
    finally:
        assert agent.close() == 0
    resumed = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        resumed.send({"follow": {"r1": {"offset": 10, "metrics": 29}}})
        again = metrics(resumed)  # from where the controller's copy ends: nothing before it sent twice
        assert (again["offset"], base64.b64decode(again["data"])) == (29, b'{"event": "step", "step": 2}\n')
        target.write_bytes(b'{"event": "step", "step": 1}\n')  # rewritten shorter: sent again from its start
        restarted = metrics(resumed)
        assert (restarted["offset"], restarted.get("restart")) == (0, True)
    finally:
        assert resumed.close() == 0


def test_a_first_look_sends_no_more_than_the_tail_asked_for_from_a_line_start(runs: Path, tmp_path: Path) -> None:
    """`watch --once` asks for the end its snapshot prints (`tail`): the log's and metrics.jsonl's last bytes."""
    lines = b"".join(b"line %d\n" % i for i in range(40000))
    records = b"".join(b'{"event": "step", "step": %d}\n' % i for i in range(4000))
    run_dir = make_run(runs, "r1", log=lines)
    (run_dir / "metrics.jsonl").write_bytes(records)
    agent = Agent(runs, env=no_gpu_env(tmp_path))
    try:
        agent.send({"follow": {"r1": {"offset": -1, "tail": 1000}}})
        agent.expect(lambda m: m.get("t") == "synced")
        first = {m["t"]: m for m in agent.seen if m.get("t") in ("log", "metrics")}
        for sent, whole in ((first["log"], lines), (first["metrics"], records)):
            start = sent["offset"]
            assert 0 < len(whole) - start <= 1000 and whole[start - 1:start] == b"\n"
            assert base64.b64decode(sent["data"]) == whole[start:]
    finally:
        assert agent.close() == 0
