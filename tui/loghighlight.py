"""Log lines made safe to draw (no escape codes, no control characters) and exceptions picked out."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rich.text import Text

from orchestrator.agent.protocol import ANSI_ESCAPE

MAX_LINE_CHARS = 4096
EXCEPTION_STYLE = "bold red"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_EXCEPTION_LINE = re.compile(
    r"^Traceback \(most recent call last\):"
    r"|^\s+File \".*\", line \d+"
    r"|^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Warning)\b"
    r"|^During handling of the above exception"
    r"|^The above exception was the direct cause"
    r"|CUDA error|Segmentation fault|core dumped"
)


def clean_line(raw: str) -> str:
    """What a terminal would show of one log line: the last `\\r` redraw, no escapes, bounded length."""
    text = raw.rstrip("\r\n")
    if "\r" in text:
        redraws = [part for part in text.split("\r") if part]
        text = redraws[-1] if redraws else ""
    text = ANSI_ESCAPE.sub("", text).replace("\t", "    ")
    text = _CONTROL.sub("?", text)
    if len(text) > MAX_LINE_CHARS:
        return text[:MAX_LINE_CHARS] + "…"
    return text


def looks_like_exception(line: str) -> bool:
    return bool(_EXCEPTION_LINE.search(line))


def exception_line_set(exception_texts: Iterable[str]) -> frozenset[str]:
    """Every line of the source's whole tracebacks, cleaned, to mark code lines the pattern alone misses."""
    lines = (clean_line(line) for text in exception_texts for line in text.splitlines())
    return frozenset(line for line in lines if line.strip())


def styled_lines(lines: Sequence[str], exception_lines: frozenset[str] = frozenset()) -> list[Text]:
    return [styled_line(line, exception_lines) for line in lines]


def styled_line(line: str, exception_lines: frozenset[str] = frozenset()) -> Text:
    text = clean_line(line)
    if text in exception_lines or looks_like_exception(text):
        # A span, not the base style: Line API rendering draws spans only.
        return Text.styled(text, EXCEPTION_STYLE)
    return Text(text)
