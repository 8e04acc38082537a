"""What a terminal shows of a log line: the one rule that the agent's `lines`, the controller's log parser and
the dashboard's log view all apply, so that the three never disagree on a line.

A line is decoded leniently, its escape sequences (colours, cursor moves, titles) are dropped, and of the
segments a `\\r` redraws over each other (progress bars) the last one that shows anything is what remains:
`"loss=1.0\\r\\x1b[0m"` shows `loss=1.0`, since the colour reset after the `\\r` draws nothing over it.
Standard library only, like the whole agent.
"""
from __future__ import annotations

import re

# The start of a trainer's step line (`[6m] step=8 loss=...`): the elapsed time in brackets, then the step number.
# The controller's log parser reads the whole line (orchestrator/trainlog/lines.py); the supervisor's hang watchdog
# needs only to know that a step went by, and which.
STEP_MARK = re.compile(r"\[(\d[\d.dhms]*)\] step=(\d+)")
# torchrun's per-rank prefix, then a Python exception line: `[rank0]: torch.OutOfMemoryError: CUDA out of memory`
FAILURE_LINE = re.compile(r"(?:\[(?:default)?rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)"
                          r"\b(?::.*)?)")


def step_number(text: str) -> int | None:
    """The step a shown line reports, when it is a step line; None otherwise."""
    match = STEP_MARK.search(text)
    return int(match.group(2)) if match is not None else None


def failure_text(text: str) -> str | None:
    """The exception line a shown line is (`RuntimeError: CUDA error: ...`), without a rank prefix; else None."""
    match = FAILURE_LINE.fullmatch(text.rstrip())
    return match.group(1) if match is not None else None


# CSI, OSC (to BEL or ST, or cut short by a line end), and the two-byte escapes
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n\r]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")


def without_escapes(text: str) -> str:
    """`text` without its escape sequences (none of which can span a `\\r` or a newline)."""
    return ANSI_ESCAPE.sub("", text) if "\x1b" in text else text


def shown_text(line) -> str:
    """What a terminal shows of one line (str, or bytes decoded leniently as UTF-8), without its newline."""
    text = without_escapes(line.decode("utf-8", "replace") if isinstance(line, (bytes, bytearray)) else line)
    if "\r" not in text:
        return text
    for segment in reversed(text.split("\r")):
        if segment:
            return segment
    return ""


def last_shown(segments, cap: int) -> tuple:
    """(text, cut) of the last of a line's `\\r` segments (bytes) that shows anything, each read up to `cap`
    bytes, and whether that one was longer; ("", False) when none shows anything. For a reader that splits
    a line itself because it arrives in pieces."""
    for segment in reversed(segments):
        text = shown_text(segment[:cap])
        if text:
            return text, len(segment) > cap
    return "", False
