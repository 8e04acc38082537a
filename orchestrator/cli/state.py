"""What every command shares: the inventory, loaded on first use, and the --verbose logging."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from ..inventory.model import Inventory, InventoryChoice, choose_inventory, load_inventory
from .output import stderr


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
            choice = self.inventory_choice()
            if choice.shadowed is not None:  # a ./inventory.yaml silently beating the one the user exported
                stderr().print(f"note: using {choice.path} (./inventory.yaml comes first), not $DFLASHCTL_INVENTORY "
                               f"{choice.shadowed}; --inventory chooses", markup=False)
            self._inventory = load_inventory(choice.path)
        return self._inventory

    def inventory_choice(self) -> InventoryChoice:
        """Which inventory file this command uses, and why (doctor says it)."""
        return choose_inventory(self.inventory_path)
