"""Mistakes in what was typed, shown the same way by every typer/click version the package allows.

typer before 0.26 raises click's exceptions; from 0.26 on it vendors click and raises copies of its own, which
`except click.ClickException` never catches. Both kinds descend from a class named `ClickException` that has
`exit_code` and `format_message()`, and a usage error carries the `ctx` it happened in: that is what this
module relies on, never where the classes are imported from.
"""
from __future__ import annotations

import copy
import difflib
import re
import sys

import typer
from typer.core import TyperCommand, TyperGroup

from ..errors import EXIT_USAGE, shorten


def _parse_error_types() -> tuple[type, ...]:
    # typer.BadParameter is click's BadParameter (typer < 0.26) or typer's own copy of it (>= 0.26)
    found = {cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException"}
    try:
        import click  # a dependency of typer < 0.26 only; a newer typer never raises click's exceptions

        found.add(click.ClickException)
    except ImportError:
        pass
    return tuple(found)


PARSE_ERRORS = _parse_error_types()


def is_parse_error(exc: BaseException) -> bool:
    if isinstance(exc, PARSE_ERRORS):
        return True
    # a future typer that moves the class again still raises something shaped like it
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int) \
        and hasattr(exc, "ctx")


def describe(exc: BaseException) -> str:
    """The one-line message, with "did you mean" where the parser found close matches."""
    possibilities = getattr(exc, "possibilities", None)
    message = getattr(exc, "message", None)
    if possibilities and isinstance(message, str):  # click words these differently from version to version
        return f"{message} (did you mean {' or '.join(sorted(possibilities))}?)"
    not_a_number = _not_a_number(exc)
    if not_a_number:
        exc.message = not_a_number
    return exc.format_message()


# what typer >= 0.26 (pydantic's error types) and click (its message) say of a value that is not a number
_NUMBER_ERRORS = {"int_parsing": "a whole number", "int_from_float": "a whole number", "float_parsing": "a number"}
_CLICK_NUMBER = re.compile(r"(.+) is not a valid (integer|float)( range)?\.$", re.DOTALL)


def _not_a_number(exc: BaseException) -> str | None:
    """`expected a whole number, got 'abc'`, for a number option given text, in one wording on every typer
    (typer >= 0.26 says pydantic's "Input should be a valid integer, unable to parse string as an integer")."""
    errors = getattr(exc.__cause__, "errors", None)
    if callable(errors):
        first = (errors() or [{}])[0]
        kind = _NUMBER_ERRORS.get(first.get("type"))
        return f"expected {kind}, got {shorten(str(first.get('input')), 40)!r}" if kind else None
    found = _CLICK_NUMBER.match(str(getattr(exc, "message", "")))
    if found:
        return f"expected {'a whole number' if found.group(2) == 'integer' else 'a number'}, got " \
               f"{shorten(found.group(1), 42)}"
    return None


def show_parse_error(exc: BaseException) -> int:
    """`dflashctl: error: MESSAGE`, the usage of the command it was in and where help is; exit 2."""
    print(f"dflashctl: error: {shorten(describe(exc), 1000)}", file=sys.stderr)
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        print(ctx.get_usage(), file=sys.stderr)
        print(f"Try '{ctx.command_path} --help' for help.", file=sys.stderr)
    return EXIT_USAGE


def _named_types() -> tuple[type, ...]:
    try:
        import click  # typer < 0.26 only
    except ImportError:
        return ()
    return (click.types.StringParamType,)


_NAMED_TYPES = _named_types()


def plain_help(params) -> None:
    """Help that shows the metavars the commands give, not the type names typer >= 0.26 adds beside each one
    (`<str>`, `<bool>`, `<list[str]>`), nor those older ones show (TEXT, BOOLEAN): a flag shows nothing, an
    argument only its name."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
        if param.default is None:
            param.show_default = False  # typer < 0.26 writes `[default: None]` for an option that has none
        if param.param_type_name == "argument":
            param.metavar = param.metavar or param.name.upper()
            param.display_type_rich = lambda *args, **kwargs: None  # typer >= 0.26 only; older ones never call it
            if isinstance(getattr(param, "type", None), _NAMED_TYPES):
                # typer < 0.26 shows an argument's type name (TEXT) beside its name: a copy named nothing
                param.type = copy.copy(param.type)
                param.type.name = ""


def _usage_piece(argument) -> str:
    """An argument in the usage line: NAME, [NAME] when optional, ... when repeated (typer >= 0.26 writes a
    required one in braces, `{TARGET}`, which reads as a set to type)."""
    name = argument.metavar or argument.name.upper()
    if any(mark in name for mark in " |["):
        return name  # a metavar that describes its own shape (launch's `[TARGET...] | [-- CMD...]`)
    name = name if argument.required else f"[{name}]"
    return name + ("..." if argument.nargs != 1 and not name.endswith("...") else "")


class _PlainHelp:
    """Plain help (see plain_help) for every parameter and the --help option, mixed into a click command class."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        plain_help(self.params)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        plain_help([option] if option is not None else [])
        return option


RAW_ARGS = "dflashctl.raw_args"  # the command's own words as typed, kept in its context for words_after_dashes


def words_after_dashes(ctx, words: list[str]) -> int | None:
    """Where, in `words` (the command's positional values in order), those typed after `--` begin; None when
    there was no `--`. The parser drops the `--` itself: the words after it are the tail of the values, and
    the first `--` whose tail they are is the one it took (an earlier one may be an option's value)."""
    typed = ctx.meta.get(RAW_ARGS) or []
    for index, word in enumerate(typed):
        tail = typed[index + 1:]
        if word == "--" and len(tail) <= len(words) and words[len(words) - len(tail):] == tail:
            return len(words) - len(tail)
    return None


class Command(_PlainHelp, TyperCommand):
    """Every command: plain help and a usage line of plain names, from every typer version alike."""

    def parse_args(self, ctx, args):
        ctx.meta[RAW_ARGS] = list(args)
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_usage_piece(param) for param in self.get_params(ctx) if param.param_type_name == "argument"]


class CommandGroup(_PlainHelp, TyperGroup):
    """The root group: plain help, and "did you mean" for an unknown command, from every typer version alike."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            ctx.fail(f"no such command {shorten(name, 60)!r}{hint}")
        return super().resolve_command(ctx, args)
