"""Shell completion: typer's `--install-completion` and `--show-completion`, the same on every typer version the
package allows.

typer finds the shell with shellingham, which looks at the parent processes: typer 0.12 lets its failure (no
shell among them: a cron job, an IDE's runner) end in a traceback, and every version answers a shell it cannot
complete for (`sh`, `tcsh`) with an unprefixed line and exit 1. Here the shell is found once, the same way
(else $SHELL names it), and one typer cannot serve is a usage error naming those it can. typer itself then
writes or prints the script; the shell calls `dflashctl` back with `_DFLASHCTL_COMPLETE` set to complete.
"""
from __future__ import annotations

import os

import typer

from .usage import plain_help

OPTIONS = ("--install-completion", "--show-completion")
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
COMPLETE_VAR = "_DFLASHCTL_COMPLETE"   # click's name for prog_name dflashctl: `_{PROG}_COMPLETE`


def completing() -> bool:
    """Whether this process was started by the shell to complete a command line (not to run one)."""
    return bool(os.environ.get(COMPLETE_VAR))


def detected_shell() -> str | None:
    """The shell this command runs under: the nearest among its parent processes, as typer asks shellingham,
    else the login shell $SHELL names."""
    try:
        import shellingham  # a dependency of typer; typer-slim installs lack it

        name = shellingham.detect_shell()[0]
    except Exception:  # noqa: BLE001 - ImportError, or no shell among the parents (ShellDetectionFailure)
        name = os.path.basename(os.environ.get("SHELL", ""))
    return name.lower() or None


def _with_shell(callback):
    """typer's callback of a completion option, given the shell by name: typer takes a str value as the shell."""
    def call(ctx, param, value):
        if value and not ctx.resilient_parsing and not isinstance(value, str):
            shell = detected_shell()
            if shell not in SHELLS:
                raise typer.BadParameter(
                    f"no completion for {'the shell ' + repr(shell) if shell else 'an unknown shell'}: dflashctl "
                    "completes in bash, zsh, fish and PowerShell")
            value = shell
        return callback(ctx, param, value)

    return call


def wire(command) -> None:
    """Give the root command's completion options (typer adds them after the command is made) the shell found
    here, and the plain help of every other option."""
    for param in command.params:
        if any(option in OPTIONS for option in getattr(param, "opts", ())) and param.callback is not None:
            param.callback = _with_shell(param.callback)
            plain_help([param])
