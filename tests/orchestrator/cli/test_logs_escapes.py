"""`logs` of a workload that writes escape sequences: the terminal gets text, never the workload's commands
(clipboard writes, titles, status reports, screen clears, in their 7-bit and 8-bit forms); colours only when
stdout is a terminal."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.lab.workloads import run_cli

# what a hostile (or merely careless) workload may print, each form with a visible word around it
HOSTILE = {
    "osc52": b"clip<\x1b]52;c;ZWNobyBwd25lZA==\x07>clip",
    "osc52_st": b"clip2<\x1b]52;c;ZWNobyBwd25lZA==\x1b\\>clip2",
    "title": b"title<\x1b]0;you have been pwned\x07>title",
    "dsr": b"dsr<\x1b[6n>dsr",
    "clear": b"clear<\x1b[2J\x1b[H>clear",
    "c1_csi": "c1csi<\u009b6n\u009b2J>c1csi".encode(),
    "c1_osc": "c1osc<\u009d0;c1 title\u009c>c1osc".encode(),
    "c1_osc_bel": "c1bel<\u009d52;c;AAAA\x07>c1bel".encode(),
    "raw_c1": b"raw<\x9b2J>raw",  # not UTF-8: a byte an 8-bit terminal takes for CSI
    "colour": b"colour<\x1b[1;31mred\x1b[0m>colour",
}
LOG = b"\n".join(HOSTILE.values()) + b"\n"
WORDS = [b"clip<>clip", b"clip2<>clip2", b"title<>title", b"dsr<>dsr", b"clear<>clear", b"c1csi<>c1csi",
         b"c1osc<>c1osc", b"c1bel<>c1bel", b"colour<red>colour"]


def assert_inert(out: bytes, *, colours: bool = False) -> None:
    """No byte of `out` makes a terminal do anything but show text (with `colours`, SGR sequences aside)."""
    if colours:
        out = out.replace(b"\x1b[1;31m", b"").replace(b"\x1b[0m", b"")
    assert b"\x1b" not in out and b"\x07" not in out and b"\x9b" not in out, out
    text = out.decode("utf-8")  # whole UTF-8: a raw C1 byte became U+FFFD
    assert not any(0x80 <= ord(char) <= 0x9f for char in text), repr(text)
    assert "pwned" not in text and "ZWNo" not in text and "c1 title" not in text


def launch_printer(inv: str, tmp_path: Path, capsysbinary) -> dict:
    """A run on `local` whose workload prints LOG and then stays up."""
    (tmp_path / "hostile.log").write_bytes(LOG)
    code, record, err = run_cli(inv, "launch", "local", "--json", "--gpus", "none", "--", "sh", "-c",
                                f"cat {tmp_path / 'hostile.log'}; sleep 60", capsys=capsysbinary)
    assert code == 0, err
    log = Path(record["log_path"])
    deadline = time.monotonic() + 10
    while log.read_bytes() != LOG:
        assert time.monotonic() < deadline, log.read_bytes()
        time.sleep(0.05)
    return record


def test_logs_of_a_run_on_local_writes_no_escape_sequence(inv, tmp_path, capsysbinary):
    record = launch_printer(inv, tmp_path, capsysbinary)
    try:
        out = _logs_bytes(inv, record["run_id"], capsysbinary)
        assert_inert(out)
        for words in WORDS:  # the text around each sequence is all still there, colours dropped off a terminal
            assert words in out, (words, out)
        assert "raw<\ufffd2J>raw".encode() in out
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsysbinary)


def test_logs_follow_writes_no_escape_sequence(inv, tmp_path, capsysbinary):
    # the lines come while -f follows (it returns once the run has ended): 5 s leave a loaded machine time to
    # start following (with 2, a CI run under load began after the run had printed, and -n 0 showed nothing)
    (tmp_path / "hostile.log").write_bytes(LOG)
    code, record, err = run_cli(inv, "launch", "local", "--json", "--gpus", "none", "--", "sh", "-c",
                                f"sleep 5; cat {tmp_path / 'hostile.log'}", capsys=capsysbinary)
    assert code == 0, err
    out = _logs_bytes(inv, record["run_id"], capsysbinary, "-f", "-n", "0")
    assert Path(record["log_path"]).read_bytes() == LOG
    assert_inert(out)
    assert all(words in out for words in WORDS), out


def test_logs_on_a_terminal_keeps_colours_and_nothing_else(inv, tmp_path, capsysbinary):
    """The real console script with a pseudo-terminal for stdout, as a person runs it."""
    record = launch_printer(inv, tmp_path, capsysbinary)
    try:
        out = _on_a_terminal([sys.executable, "-m", "orchestrator", "--inventory", inv, "logs", record["run_id"]])
    finally:
        run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsysbinary)
    out = out.replace(b"\r\n", b"\n")  # the terminal's own line discipline
    assert b"colour<\x1b[1;31mred\x1b[0m>colour" in out
    assert_inert(out, colours=True)
    assert all(words in out for words in WORDS[:-1]), out


def test_a_launch_that_fails_shows_the_logs_last_lines_as_text_only(inv, tmp_path, capsysbinary):
    (tmp_path / "hostile.log").write_bytes(LOG)
    code, out, err = run_cli(inv, "launch", "local", "--gpus", "none", "--", "sh", "-c",
                             f"cat {tmp_path / 'hostile.log'}; exit 3", capsys=capsysbinary)
    assert code == 1 and b"exit code 3" in err, err
    assert_inert(err)
    assert all(words in err for words in WORDS), err  # the last lines are still shown


def test_a_sequence_cut_between_two_reads_never_passes_as_text():
    from dflash_records.terminaltext import TerminalStream, for_terminal

    for data in HOSTILE.values():
        for cut in range(1, len(data)):
            stream = TerminalStream()
            shown = stream.feed(data[:cut]) + stream.feed(data[cut:]) + stream.feed(b"", final=True)
            assert shown == for_terminal(data.decode("utf-8", "replace")), (data, cut, shown)
            assert_inert(shown.encode())


def test_progress_bars_and_tabs_stay_other_controls_go():
    from dflash_records.terminaltext import for_terminal

    assert for_terminal("a\tb\r50%\r100%\n") == "a\tb\r50%\r100%\n"
    assert for_terminal("bell\x07 back\x08space\x0cfeed\x7f") == "bell backspacefeed"


def _logs_bytes(inv: str, run_id: str, capsysbinary, *args: str) -> bytes:
    """The bytes `logs` writes to stdout, in-process (stdout not a terminal)."""
    code, out, err = run_cli(inv, "logs", run_id, *args, capsys=capsysbinary)
    assert code == 0, err
    return out


def _on_a_terminal(argv: list[str], timeout: float = 60.0) -> bytes:
    """Everything `argv` writes to a pseudo-terminal that is its stdout, until it exits."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's last writer is gone
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif proc.poll() is not None:
                break
    finally:
        os.close(leader)
        proc.kill() if proc.poll() is None else None
        proc.wait(timeout=10)
    return b"".join(chunks)
