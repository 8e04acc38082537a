"""Usage mistakes in-process (orchestrator/cli/usage.py): one path for every typer/click exception class."""
from __future__ import annotations

import pytest
import typer

from orchestrator.cli import main
from orchestrator.cli.usage import describe, is_parse_error
from orchestrator.errors import shorten


@pytest.mark.parametrize("args, words", [
    (["lanch", "local"], "did you mean 'launch'"),
    (["ps", "--jsn"], "did you mean --json?"),
    (["logs"], "Missing argument 'RUN'"),
    (["kill", "--grace", "nan", "x"], "--grace"),
    (["launch", "local", "--dist-timeout", "inf", "--", "true"], "--dist-timeout"),
    (["watch", "--once", "--interval", "nan"], "--interval"),
])
def test_usage_mistakes_in_process(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dflashctl: error: ") and words in err.splitlines()[0] and "Traceback" not in err


def test_typers_own_exception_classes_are_parse_errors_whatever_their_module():
    assert is_parse_error(typer.BadParameter("x"))

    class LookAlike(Exception):  # shaped like click's UsageError, from no module we know
        exit_code = 2
        ctx = None

        def format_message(self) -> str:
            return "bad"

    assert is_parse_error(LookAlike()) and describe(LookAlike()) == "bad"
    assert not is_parse_error(ValueError("a bug, not a mistake"))


def test_long_input_is_cut_in_the_middle():
    text = "a" * 50 + "b" * 100_000 + "c" * 50
    cut = shorten(text)
    assert len(cut) < 300 and cut.startswith("a" * 50) and cut.endswith("c" * 50) and "more characters" in cut
    assert shorten("short") == "short"
