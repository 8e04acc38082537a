"""What a terminal shows of a log line: the one rule that the agent's `lines`, the controller's log parser and
the dashboard's log view all apply, so that the three never disagree on a line.

A line is decoded leniently, its escape sequences (colours, cursor moves, titles) are dropped, and of the
segments a `\\r` redraws over each other (progress bars) the last one that shows anything is what remains:
`"loss=1.0\\r\\x1b[0m"` shows `loss=1.0`, since the colour reset after the `\\r` draws nothing over it.
An escape sequence counts in its 7-bit form (ESC [) and in its 8-bit one (the C1 control U+009B, which a terminal
that takes C1 controls reads as ESC [ too).

What a workload wrote may also go to a terminal whole (`logs`): `for_terminal` and `TerminalStream` make it
safe there, every escape sequence and control character gone (no clipboard writes, titles, status reports or
screen clears), colours (SGR) kept only when asked (the terminal renders them).
Standard library only, like the whole of dflash_records.
"""
from __future__ import annotations

import codecs
import re

# the start of a trainer's step line: the hang watchdog needs only to know that a step went by, and which
from .step import STEP_MARK
from .digits import ascii_decimal

# torchrun's per-rank prefix, then a Python exception line: `[rank0]: torch.OutOfMemoryError: CUDA out of memory`
FAILURE_LINE = re.compile(r"(?:\[(?:default)?rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)"
                          r"\b(?::.*)?)")


def step_number(text: str) -> int | None:
    """The step a shown line reports, when it is a step line; None otherwise (and for a step number of more
    digits than any counter holds: whatever a workload prints, reading it must not raise)."""
    match = STEP_MARK.search(text)
    return ascii_decimal(match.group(2)) if match is not None else None


def failure_text(text: str) -> str | None:
    """The exception line a shown line is (`RuntimeError: CUDA error: ...`), without a rank prefix; else None."""
    match = FAILURE_LINE.fullmatch(text.rstrip())
    return match.group(1) if match is not None else None


# CSI; OSC, DCS, SOS, PM and APC strings (to BEL or ST, or cut short by a line end); the two-byte escapes; each in
# its 7-bit form (ESC and a letter) and its 8-bit one (a C1 control); and any other C1 control left alone
ANSI_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n\r]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-Z\\-_]?|[\x80-\x9f]")
ESCAPE_STARTS = "\x1b\x9b\x9d\x90\x98\x9e\x9f"
# a colour or text attribute: the one escape a terminal may be given, and only where colours are shown
SGR = re.compile(r"\x1b\[[0-9;:]*m")
SGR_OR_ESCAPE = re.compile(f"({SGR.pattern})|{ANSI_ESCAPE.pattern}")
# what is neither text nor an escape: C0 controls and DEL, tab, newline and carriage return aside (and ESC, which
# only a kept colour sequence still holds once the escapes are gone)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1a\x1c-\x1f\x7f]")
# what may still become an escape sequence, for a stream that holds it back until its end comes
CSI_SO_FAR = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*")
STRING_STARTS = ("\x1b]", "\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x9d", "\x90", "\x98", "\x9e", "\x9f")
STRING_END = re.compile(r"\x07|\x1b\\|\x9c")
PENDING_MAX_CHARS = 4096  # the longest unfinished escape a stream holds back before it lets it go (escape dropped)


def without_escapes(text: str) -> str:
    """`text` without its escape sequences (none of which can span a `\\r` or a newline)."""
    if text.isascii() and "\x1b" not in text:
        return text
    return ANSI_ESCAPE.sub("", text)


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


def for_terminal(text: str, *, colours: bool = False) -> str:
    """`text` safe to write to a terminal: no escape sequence (7-bit or 8-bit) and no control character but tab,
    newline and carriage return (progress bars redraw with it); with `colours`, colour sequences (SGR) kept."""
    if colours:
        text = SGR_OR_ESCAPE.sub(lambda match: match.group(1) or "", text)
    else:
        text = without_escapes(text)
    return CONTROL.sub("", text)


class TerminalStream:
    """`for_terminal` over bytes that arrive in pieces (a followed log): a UTF-8 character or an escape sequence
    cut between two pieces is held back until its end comes, so that its parts never pass as text."""

    def __init__(self, *, colours: bool = False) -> None:
        self._colours = colours
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""

    def feed(self, data: bytes, *, final: bool = False) -> str:
        text = self._held + self._decoder.decode(data, final)
        cut = len(text) if final else _finished_up_to(text)
        self._held = text[cut:]
        return for_terminal(text[:cut], colours=self._colours)


def _finished_up_to(text: str) -> int:
    """Where `text` may be cut without cutting an escape sequence: before the last one when it may go on."""
    start = max(text.rfind(char) for char in ESCAPE_STARTS)
    tail = text[start:]
    if start < 0 or "\n" in tail or "\r" in tail or len(tail) > PENDING_MAX_CHARS:
        return len(text)
    return start if _unfinished(tail) else len(text)


def _unfinished(tail: str) -> bool:
    """Whether the escape sequence that `tail` starts with could still go on (its last byte is yet to come)."""
    if tail.startswith(("\x1b[", "\x9b")):
        return CSI_SO_FAR.fullmatch(tail) is not None
    if tail.startswith(STRING_STARTS):
        return STRING_END.search(tail) is None
    return tail == "\x1b"
