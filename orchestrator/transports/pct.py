"""Commands inside an LXC container of a Proxmox host, through `pct exec` on that host.

`pct exec CTID -- argv...` hands argv to lxc-attach without a shell, so wrapping keeps every argument intact;
the host transport quotes the whole line once for the host's shell. Note pct's habits (it kills what is left in
the command's process group when it returns, and stays open while a background child holds its output): the
run lifecycle works around them; this transport only passes commands through.
"""
from __future__ import annotations

import shlex
from typing import Sequence

from ..errors import CommandTimeout
from .base import DEFAULT_TIMEOUT, CommandResult, RemoteProcess, Transport, shown_argv


class PctTransport(Transport):
    def __init__(self, host: Transport, ctid: int, *, pct_command: str = "pct", label: str | None = None) -> None:
        self.host = host
        self.ctid = ctid
        self.pct = shlex.split(pct_command)  # "sudo pct" or a full path are both fine
        self.label = label or f"{host.label}/{ctid}"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return [*self.pct, "exec", str(self.ctid), "--", *argv]

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = DEFAULT_TIMEOUT) -> CommandResult:
        try:
            result = self.host.run(self.wrap(argv), stdin=stdin, timeout=timeout)
        except CommandTimeout:  # the host transport ended the `pct exec` it started; say which target hung
            raise CommandTimeout(f"{self.label}: unresponsive: {shown_argv(argv)} did not finish in "
                                 f"{timeout:g}s (ended its `pct exec` on {self.host.label})") from None
        return CommandResult(tuple(argv), result.exit_code, result.stdout, result.stderr)

    def start(self, argv: Sequence[str]) -> RemoteProcess:
        return self.host.start(self.wrap(argv))
