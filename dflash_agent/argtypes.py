"""The agent's argument parser and the value types of its options: a bad value is a BadInput (one JSON answer,
exit 2), never argparse's own exit."""
from __future__ import annotations

import argparse
import sys

from dflash_records.protocol import BAD_USAGE, ascii_decimal

from .errors import BadInput


class HelpShown(Exception):
    """--help was asked for: the text went to stderr, stdout still gets its one JSON object."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInput("{}: {}".format(self.prog, message), code=BAD_USAGE)

    def print_help(self, file=None) -> None:
        super().print_help(sys.stderr)

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        if status == 0:
            raise HelpShown()
        raise BadInput(message or "bad usage", code=BAD_USAGE)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number of seconds: {!r}".format(text))
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("seconds must be a finite number >= 0: {!r}".format(text))
    return value


def backoff_seconds(text: str) -> float:
    from dflash_records.restart import check_backoff
    try:
        return check_backoff(seconds(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError("{}: {!r}".format(exc, text))


def count(text: str) -> int:
    value = ascii_decimal(text)
    if value is None:
        raise argparse.ArgumentTypeError("not a count (digits 0-9): {!r}".format(text))
    return value
