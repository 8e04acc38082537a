"""Groups the lines of a Python traceback (chained blocks, exception groups, torchrun's per-rank prefix) into one
event, and reads a lone line naming an exception or error as an event of its own."""
from __future__ import annotations

import re
from collections import deque

from dflash_records.protocol import SUPERVISOR_LINE_PREFIX

from .lines import ExceptionEvent

# A traceback longer than this keeps its head and its tail: the cause is at the end, the entry point at the top.
MAX_TRACEBACK_LINES = 2000
# Lines of other output allowed inside an unfinished traceback (threads interleave) before it is given up.
MAX_FOREIGN_LINES = 50

TRACEBACK_MARK = "Traceback (most recent call last):"
_CHAIN_MESSAGES = ("During handling of the above exception, another exception occurred:",
                   "The above exception was the direct cause of the following exception:")
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::(?: (.*))?)?")
_GROUP_EXCEPTION_LINE = re.compile(r"\s*\| ([A-Za-z_][\w.]*)(?::(?: (.*))?)?")  # `  | ExceptionGroup: ...`
_EXCEPTION_SUFFIX = re.compile(r"(?:Error|Exception|Interrupt|Exit)\b")
# Python's threading and finalisers print such a line just before the traceback it introduces.
TRACEBACK_HEADER = re.compile(r"Exception (?:in thread .*:|ignored in\b.*)")
# A line that, even alone (a screen of the log shows no context), reads as part of an error report.
EXCEPTION_LINE = re.compile("|".join(
    ["^" + re.escape(marker) for marker in (TRACEBACK_MARK, *_CHAIN_MESSAGES)]
    + [r"^\s+File \".*\", line \d+", r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Warning)\b",
       r"CUDA error|Segmentation fault|core dumped"]))
_BODY, _AFTER_EXCEPTION, _CHAIN = range(3)
TOOK, FOREIGN, CLOSED = "took", "foreign", "closed"


def looks_like_exception(line: str) -> bool:
    """A line that reads as part of an error report; never the supervisor's own, which may quote one."""
    return EXCEPTION_LINE.search(line) is not None and not line.startswith(SUPERVISOR_LINE_PREFIX)


def standalone_exception(text: str, line_no: int) -> ExceptionEvent:
    """`RuntimeError: msg` -> type RuntimeError, message msg; without a `Type:` the message is the line."""
    exc_type, message = None, text.strip()
    match = _EXCEPTION_SUFFIX.search(text)
    if match is not None:
        # walk back over the dotted name by hand: a regex for `[\w.]*Error` backtracks quadratically on long words
        start = match.start()
        while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._"):
            start -= 1
        exc_type = text[start:match.end()]
        if text[match.end():match.end() + 1] == ":" and text[match.end() + 1:].strip():
            message = text[match.end() + 1:].strip()
    return ExceptionEvent(line_no, text, exc_type, message, 1, False)


class OpenTraceback:
    """One traceback being read, line by line, until the line after its last exception line shows it ended."""

    def __init__(self, line_no: int, lines: list[str], prefix: str) -> None:
        self.line_no = line_no
        self.prefix = prefix  # e.g. torchrun's `[rank0]: `, which every line of this traceback carries
        self.head = list(lines)
        self.tail: deque[str] = deque(maxlen=MAX_TRACEBACK_LINES // 2)
        self.n_lines = len(lines)
        self.omitted = 0
        self.state = _BODY
        self.held_blanks: list[tuple[int, str]] = []  # after an exception line: part of a chain, or not
        self.foreign_run = 0
        self.exc_type: str | None = None
        self.message = ""
        # an exception group's traceback is indented all through, its exception lines included
        self.group = "Exception Group" in lines[-1]

    def take(self, text: str, line_no: int) -> str:
        """TOOK: the line is part of this traceback; FOREIGN: other output interleaved with it; CLOSED: the
        traceback ended before this line."""
        if self.prefix and not text.startswith(self.prefix):
            return CLOSED if self.state != _BODY else self._foreign()
        body = text[len(self.prefix):]
        if self.state == _BODY:
            return self._take_body(text, body, line_no)
        if self.state == _AFTER_EXCEPTION:
            return self._take_after_exception(text, body, line_no)
        return self._take_chain(text, body)

    def _take_body(self, text: str, body: str, line_no: int) -> str:
        if body[:1] in ("", " ", "\t") or TRACEBACK_MARK in body:
            self._keep(text)
            self.group |= "Exception Group" in body
            if self.group and self.exc_type is None:
                self._note_group_exception(body)
            return TOOK
        if self.group and self.exc_type is not None:
            return self._take_after_exception(text, body, line_no)
        match = _EXCEPTION_LINE.fullmatch(body)
        if match is None:
            return self._foreign()
        self._keep(text)
        self.exc_type, self.message = match.group(1), match.group(2) or ""
        self.state = _AFTER_EXCEPTION
        return TOOK

    def _take_after_exception(self, text: str, body: str, line_no: int) -> str:
        if not body.strip():
            self.held_blanks.append((line_no, text))
            return TOOK
        if body.strip() in _CHAIN_MESSAGES:
            self._keep_held_blanks()
            self._keep(text)
            self.state = _CHAIN
            return TOOK
        if not self.held_blanks and body[:1] in (" ", "\t"):  # notes, indented continuation of the message
            self._keep(text)
            return TOOK
        return CLOSED

    def _take_chain(self, text: str, body: str) -> str:
        if not body.strip() or TRACEBACK_MARK in body:
            self._keep(text)
            if body.strip():
                self.state, self.exc_type, self.group = _BODY, None, "Exception Group" in body
            return TOOK
        return CLOSED

    def _note_group_exception(self, body: str) -> None:
        match = _GROUP_EXCEPTION_LINE.fullmatch(body)
        if match is not None:
            self.exc_type, self.message = match.group(1), match.group(2) or ""

    def _foreign(self) -> str:
        self.foreign_run += 1
        return CLOSED if self.foreign_run > MAX_FOREIGN_LINES else FOREIGN

    def _keep_held_blanks(self) -> None:
        for _, blank in self.held_blanks:
            self._keep(blank)
        self.held_blanks.clear()

    def _keep(self, text: str) -> None:
        self.foreign_run = 0
        self.n_lines += 1
        if len(self.head) < MAX_TRACEBACK_LINES // 2:
            self.head.append(text)
            return
        self.omitted += len(self.tail) == self.tail.maxlen
        self.tail.append(text)

    def event(self) -> ExceptionEvent:
        omitted = [f"... {self.omitted} lines omitted ..."] if self.omitted else []
        text = "\n".join(self.head + omitted + list(self.tail))
        return ExceptionEvent(self.line_no, text, self.exc_type, self.message, self.n_lines, True)

    @property
    def finished(self) -> bool:
        """Its last exception line has been read; only a chained block could still follow."""
        return self.state == _AFTER_EXCEPTION or (self.group and self.exc_type is not None)


def traceback_prefix(before_mark: str) -> str:
    # `[rank0]: Traceback ...` repeats its prefix on every line; an exception group's `  + Exception Group
    # Traceback ...` does not, its lines are merely indented.
    return "" if not before_mark or before_mark[0] in " \t" or "Exception Group" in before_mark else before_mark
