"""What every command shares: the inventory, loaded on first use, and the --verbose logging."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from ..inventory.model import Inventory, find_inventory, load_inventory


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
