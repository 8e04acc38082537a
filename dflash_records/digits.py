"""Whether a text is a number: ASCII digits only.

str.isdigit() takes '²' and '①' (which int() then refuses), int() takes '٣' and ' 3'; a CTID, a GPU index, a
restart count or a step number typed, configured or read back is neither. Nor is a number of more than
MAX_DECIMAL_DIGITS digits (2**64 has 20): int() raises past 4300, and a log line or an argument may hold more.
"""
from __future__ import annotations

MAX_DECIMAL_DIGITS = 20


def ascii_decimal(text: object) -> int | None:
    """The value of `text` when it is one to MAX_DECIMAL_DIGITS ASCII digits and nothing else (no sign, space or
    '_'), else None."""
    if isinstance(text, str) and len(text) <= MAX_DECIMAL_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None
