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


# str.isdigit() takes '²', '³' and '①' (int() then raised), int() reads '٣' as 3: a number typed is ASCII digits
UNICODE_DIGITS = [
    (["launch", "local", "--gpus", "\u00b2", "--", "true"], "bad --gpus '\u00b2'"),
    (["launch", "local", "--gpus", "0-\u00b3", "--", "true"], "bad --gpus '0-\u00b3'"),
    (["launch", "local", "--gpus", "\u2460", "--", "true"], "bad --gpus '\u2460'"),
    (["launch", "local", "--gpus", "\u0663", "--", "true"], "bad --gpus '\u0663'"),
    (["ps", "pve1/\u00b2"], "bad target 'pve1/\u00b2': the container id after '/' must be a number"),
    (["ps", "pve1/\u0663\u0660\u0660"], "bad target 'pve1/\u0663\u0660\u0660'"),
]
INVENTORY = "hosts:\n  pve1:\n    address: 192.0.2.1\n    containers:\n      300: {gpus: 4}\n"


# more digits than int() converts (4300): one usage line, no ValueError traceback
DIGITS = "9" * 5000
LONG_NUMBERS = [
    (["ps", "pve1/" + DIGITS], "bad target 'pve1/999"),
    (["launch", "local", "--gpus", DIGITS, "--", "true"], "bad --gpus '999"),
    (["launch", "local", "--gpus", "0-" + DIGITS, "--", "true"], "bad --gpus '0-999"),
    (["pull", "pve1/300", "--checkpoint", "step_" + DIGITS], "--checkpoint 'step_999"),
]


@pytest.mark.parametrize("args, words", UNICODE_DIGITS + LONG_NUMBERS)
def test_unicode_digits_and_overlong_numbers_are_one_usage_line(args, words, tmp_path, capsys):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    assert main(["--inventory", str(tmp_path / "inventory.yaml"), *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"dflashctl: error: {words}"), captured.err[:300]
    assert len(captured.err.strip().splitlines()) == 1 and len(captured.err) < 400 and captured.out == ""


# the CLI takes exactly the --env keys the agent takes (protocol.env_pair): refused here, before any connection
@pytest.mark.parametrize("pair, words", [("\u00c9T\u00c9=1", "ASCII letters"), ("1X=y", "ASCII letters"),
                                         ("NOEQUALS", "KEY=VALUE"), ("DFLASH_RUN_ID=other", "set by the agent")])
def test_an_env_key_the_agent_would_refuse_is_one_usage_line(pair, words, tmp_path, capsys):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    assert main(["--inventory", str(tmp_path / "inventory.yaml"), "launch", "pve1/300", "--env", pair,
                 "--", "true"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("dflashctl: error: bad --env") and words in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1


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
