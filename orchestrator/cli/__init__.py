"""The `dflashctl` command line. This module only wires the commands and turns errors into exit codes."""
from __future__ import annotations

import sys

import typer

from ..errors import EXIT_USAGE, DflashError
from ..transports.shortage import raise_open_file_limit
from . import cleanup, completion, demo, doctor, kill, launch, logs, ps, pull, sweep, version, watch
from .state import AppState
from .usage import Command, CommandGroup, is_parse_error, show_parse_error

HELP = (
    "Launch, watch, stop and clean up long GPU training runs in Proxmox LXC containers, on plain SSH hosts "
    "and on this machine.\n\n"
    "TARGET is HOST/CTID (a container), HOST (a host used without containers) or `local`. Hosts and containers "
    "come from the inventory: --inventory, else ./inventory.yaml, else $DFLASHCTL_INVENTORY, else just `local`."
    "\n\n"
    "Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad inventory/config, 3 a target unreachable."
)

app = typer.Typer(name="dflashctl", help=HELP, cls=CommandGroup, add_completion=True, rich_markup_mode="markdown",
                  pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})


@app.callback()
def _root(
    ctx: typer.Context,
    inventory: str = typer.Option(None, "--inventory", "-i", metavar="PATH",
                                  help="Inventory file (default: ./inventory.yaml, else $DFLASHCTL_INVENTORY)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every remote operation to stderr."),
    _version: bool = typer.Option(False, "--version", callback=version.print_version, is_eager=True,
                                  help="Print dflashctl's version and exit (`dflashctl version` says more)."),
) -> None:
    ctx.obj = AppState(inventory_path=inventory, verbose=verbose)


app.command("doctor", cls=Command)(doctor.doctor)
app.command("launch", cls=Command)(launch.launch)
app.command("ps", cls=Command)(ps.ps)
app.command("logs", cls=Command)(logs.logs)
app.command("kill", cls=Command)(kill.kill)
app.command("pull", cls=Command)(pull.pull)
app.command("cleanup", cls=Command)(cleanup.cleanup)
app.add_typer(sweep.app, name="sweep")
app.command("watch", cls=Command)(watch.watch)
app.command("demo", cls=Command)(demo.demo)
app.command("version", cls=Command)(version.version)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (the console script exits with it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    raise_open_file_limit()  # a fleet's connections: the hard limit's room, not a shell's low soft default
    command = typer.main.get_command(app)
    completion.wire(command)
    # the help, then the mistake: the same on every typer version (click's own differ)
    if not args and not completion.completing():
        command.main(args=["--help"], prog_name="dflashctl", standalone_mode=False)
        print("dflashctl: error: no command given (one of the commands above)", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = command.main(args=args, prog_name="dflashctl", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("dflashctl: aborted", file=sys.stderr)
        return 130
    except DflashError as exc:
        print(f"dflashctl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dflashctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not is_parse_error(exc):
            raise
        return show_parse_error(exc)
    return result if isinstance(result, int) else 0


__all__ = ["app", "main", "EXIT_USAGE"]
