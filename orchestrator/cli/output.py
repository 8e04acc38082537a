"""What commands print through: the consoles (human text; stderr when --json owns stdout) and the JSON object.

`--json` prints exactly one versioned object on stdout (print_json); tables and progress go through rich.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

from dflash_records.protocol import ascii_decimal
from dflash_records.terminaltext import for_terminal

JSON_VERSION = 1


def stdout() -> Console:
    # piped into grep or a file, tables should not be squeezed to the 80 columns rich assumes there; COLUMNS,
    # where set, is the width asked for (rich reads it)
    asked = ascii_decimal(os.environ.get("COLUMNS"))
    width = None if sys.stdout.isatty() else (asked or 160)
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def stderr() -> Console:
    """Human text and progress when --json owns stdout."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(payload: dict[str, Any]) -> None:
    """One versioned JSON object on stdout."""
    sys.stdout.write(json.dumps({"version": JSON_VERSION, **payload}, indent=2, default=str) + "\n")
    sys.stdout.flush()


def say(console: Console, text: str) -> None:
    """One line of text that may hold what a workload chose (a process's command line, a log line), with every
    escape sequence and control character taken out: such text never drives the terminal."""
    console.print(for_terminal(text), markup=False)


def about(target: str, message: str) -> str:
    """`message` prefixed with its target, unless it already names it (transport errors start with the host)."""
    host = target.split("/")[0]
    return message if message.startswith(host) else f"{target}: {message}"
