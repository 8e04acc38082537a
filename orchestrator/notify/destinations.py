"""Where notifications go: the inventory's `notify:` entries and `--notify URL`s, each checked by apprise.

apprise is an optional extra (`pip install 'dflashctl[notify]'`): it is imported only when a watch has a
destination, and its absence is one line saying how to install it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..alertkinds import DEFAULT_KINDS, DEFAULT_REPEAT_S
from ..errors import UsageError, shorten
from ..inventory.model import Inventory

INSTALL_HINT = "pip install 'dflashctl[notify]' (or: pip install apprise)"


@dataclass(frozen=True, eq=False)
class Destination:
    """One apprise URL: the kinds it receives, its repeat window, and the apprise plugin that sends to it."""

    url: str
    kinds: frozenset[str]
    repeat_s: float
    plugin: Any  # apprise's plugin object for the URL (its notify() sends one message)

    @property
    def shown(self) -> str:
        """The URL with its secrets (tokens, passwords) masked, as apprise masks them."""
        try:
            return str(self.plugin.url(privacy=True)).split("?", 1)[0]
        except Exception:  # a plugin that cannot print itself: its scheme is enough to tell which one
            return self.url.split("://", 1)[0] + "://..."


def load_apprise() -> Any:
    try:
        import apprise
    except ImportError:
        raise UsageError(f"notifications need apprise, which is not installed: {INSTALL_HINT}") from None
    return apprise


def destinations(inventory: Inventory, urls: Sequence[str], *, repeat_s: float | None = None) -> list[Destination]:
    """The inventory's `notify:` entries, then each `--notify URL` (default kinds); `repeat_s` overrides every
    entry's window. Empty when there is nothing to send to (apprise is then not needed)."""
    entries = [(spec.url, spec.kinds, spec.repeat_s, _where(inventory, spec.line, index))
               for index, spec in enumerate(inventory.model.notify)]
    entries += [(url, list(DEFAULT_KINDS), DEFAULT_REPEAT_S, "--notify") for url in urls]
    if not entries:
        return []
    apprise = load_apprise()
    found = []
    for url, kinds, repeat, where in entries:
        plugin = _plugin(apprise, url)
        if plugin is None:
            raise UsageError(f"{where}: apprise does not understand the URL {shorten(url, 80)!r} (each service's "
                             "URL form: https://github.com/caronc/apprise/wiki)")
        found.append(Destination(url, frozenset(kinds), repeat if repeat_s is None else repeat_s, plugin))
    return found


def _plugin(apprise: Any, url: str) -> Any:
    try:
        return apprise.Apprise.instantiate(url, suppress_exceptions=True)
    except Exception:  # apprise raises its own errors for some malformed URLs despite being asked not to
        return None


def _where(inventory: Inventory, line: int | None, index: int) -> str:
    field = f"notify.{index}.url"
    return f"{inventory.path}:{line}: {field}" if inventory.path else field
