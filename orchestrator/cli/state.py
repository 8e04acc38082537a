"""What every command shares: the inventory (loaded on first use) and the output streams."""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from ..inventory import Inventory, find_inventory, load_inventory

JSON_VERSION = 1


@dataclass
class AppState:
    inventory_path: str | None = None
    verbose: bool = False
    _inventory: Inventory | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.verbose:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(find_inventory(self.inventory_path))
        return self._inventory


def stdout() -> Console:
    # piped into grep or a file, tables should not be squeezed to the 80 columns rich assumes there
    width = None if sys.stdout.isatty() else 160
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def stderr() -> Console:
    """Human text and progress when --json owns stdout."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(payload: dict[str, Any]) -> None:
    """One versioned JSON object on stdout."""
    sys.stdout.write(json.dumps({"version": JSON_VERSION, **payload}, indent=2, default=str) + "\n")
    sys.stdout.flush()


def parse_gpus(text: str | None) -> list[int] | None:
    """`0,1,3` or `0-7` (or a mix: `0-3,6`) into sorted distinct indices, each at most MAX_GPU_INDEX
    (checked before a range is expanded: `0-99999999` is refused at once, not after building it)."""
    if text is None:
        return None
    from ..errors import UsageError, shorten
    from ..runs import MAX_GPU_INDEX

    shown = shorten(text, 60)
    indices: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"bad --gpus {shown!r}: use indices like 0,1 or a range like 0-7")
        start, stop = int(lo), int(hi) if sep else int(lo)
        if stop < start:
            raise UsageError(f"bad --gpus {shown!r}: range {shorten(part, 40)} runs backwards")
        if stop > MAX_GPU_INDEX:
            raise UsageError(f"bad --gpus {shown!r}: GPU indices go up to {MAX_GPU_INDEX}")
        indices.update(range(start, stop + 1))
    return sorted(indices)


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    from ..errors import UsageError, shorten

    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UsageError(f"bad --env {shorten(pair, 80)!r}: use KEY=VALUE with KEY made of letters, digits "
                             f"and _")
        env[key] = value
    return env


def about(target: str, message: str) -> str:
    """`message` prefixed with its target, unless it already names it (transport errors start with the host)."""
    host = target.split("/")[0]
    return message if message.startswith(host) else f"{target}: {message}"
