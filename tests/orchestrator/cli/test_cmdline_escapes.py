"""A process's command line is the workload's to choose: `kill` and `cleanup` print survivors' and orphans' command
lines, and no escape sequence or control character in them reaches the terminal (OSC 52 would set the clipboard)."""
from __future__ import annotations

from dflash_records.answers import KillAnswer
from dflash_records.plans import CleanupAnswer
from orchestrator.cli import cleanup, kill

HOSTILE = "python3 train.py \x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b6n\x9d0;title\x9c done"


def test_kill_prints_a_survivors_command_line_as_text_only(capsysbinary) -> None:
    kill._print({"local": KillAnswer.from_dict({"ok": False, "runs": [
        {"run_id": "r1", "run": {"state": "running"}, "survivors": [{"pid": 42, "cmdline": HOSTILE}]}]})}, queued=set())
    written = capsysbinary.readouterr().out.decode()
    assert "STILL ALIVE: 42 python3 train.py" in written
    assert "\x1b" not in written and "\x9b" not in written and "\x9d" not in written and "\x07" not in written


def test_cleanup_prints_what_it_did_as_text_only(capsysbinary) -> None:
    cleanup._print([("local", CleanupAnswer.from_dict({
        "ok": True, "actions": [{"description": f"ended orphan 42 ({HOSTILE})"}],
        "unfixable": [{"description": f"zombie of {HOSTILE}"}]}))])
    written = capsysbinary.readouterr().out.decode()
    assert "ended orphan 42 (python3 train.py" in written and "zombie of python3 train.py" in written
    assert "\x1b" not in written and "\x9b" not in written and "\x9d" not in written and "\x07" not in written
