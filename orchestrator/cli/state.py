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
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def stderr() -> Console:
    """Human text and progress when --json owns stdout."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(payload: dict[str, Any]) -> None:
    """One versioned JSON object on stdout."""
    sys.stdout.write(json.dumps({"version": JSON_VERSION, **payload}, indent=2, default=str) + "\n")
    sys.stdout.flush()
