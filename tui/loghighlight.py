"""Log lines made safe to draw (no escape codes, no control characters) and exceptions picked out (by the
log reader's own looks_like_exception, and the whole tracebacks the source grouped)."""
from __future__ import annotations

import re
from collections.abc import Iterable

from rich.text import Text

from dflash_records.terminaltext import shown_text
from orchestrator.display import clip
from orchestrator.trainlog.tracebacks import looks_like_exception

MAX_LINE_CHARS = 4096
EXCEPTION_STYLE = "bold red"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_line(raw: str) -> str:
    """What a terminal would show of one log line (terminaltext's rule), drawable: tabs as spaces, other control
    characters as '?', bounded length."""
    text = shown_text(raw.rstrip("\n")).replace("\t", "    ")
    text = _CONTROL.sub("?", text)
    return clip(text, MAX_LINE_CHARS + 1)  # the first MAX_LINE_CHARS characters whole, then `…`


def exception_line_set(exception_texts: Iterable[str]) -> frozenset[str]:
    """Every line of the source's whole tracebacks, cleaned, to mark code lines the pattern alone misses."""
    lines = (clean_line(line) for text in exception_texts for line in text.splitlines())
    return frozenset(line for line in lines if line.strip())


def styled_line(line: str, exception_lines: frozenset[str] = frozenset()) -> Text:
    text = clean_line(line)
    if text in exception_lines or looks_like_exception(text):
        # A span, not the base style: Line API rendering draws spans only.
        return Text.styled(text, EXCEPTION_STYLE)
    return Text(text)
