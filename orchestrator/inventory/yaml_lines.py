"""YAML loading that remembers the line of every key, and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys; in an inventory that hides a mistake (two entries for one
container), so duplicates are an error here. Lines let validation errors point at `file:line`.

Walking the composed document follows every alias: a 1 KB file of nested aliases ("billion laughs") would be
walked 10^9 times over (23 GB for `ps`). So the document is measured first, each alias counted as the subtree
it repeats (each node's count computed once), and one past MAX_NODES values is refused before the walk.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import InventoryError

MAX_BYTES = 1 << 20   # an inventory of hundreds of hosts is a few dozen KiB
MAX_NODES = 200_000   # values after expanding aliases: far beyond any real inventory


@dataclass
class LocatedYaml:
    data: Any
    lines: dict[tuple[str, ...], int] = field(default_factory=dict)

    def line_of(self, loc: tuple) -> int:
        """The line of the deepest known part of `loc` (a missing field points at its parent)."""
        key = tuple(str(p) for p in loc)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return self.lines.get((), 1)


def load_located(text: str, filename: str) -> LocatedYaml:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        located = LocatedYaml(data=None)
        if node is not None:
            _check_expansion(node, filename)
            located.lines[()] = node.start_mark.line + 1
            located.data = _build(loader, node, (), located, filename)
        return located
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise InventoryError(f"{filename}:{line}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{filename}: YAML error: {exc}") from None
    except RecursionError:
        raise InventoryError(f"{filename}: the YAML nests too deeply") from None
    finally:
        loader.dispose()


def _check_expansion(node: yaml.Node, filename: str) -> None:
    count = _expanded(node, {})
    if count > MAX_NODES:
        shown = str(count) if count < 10**12 else f"about 10^{len(str(count)) - 1}"
        raise InventoryError(f"{filename}: the inventory expands to {shown} values through its YAML aliases; the "
                             f"limit is {MAX_NODES} (an alias bomb?)")


def _expanded(node: yaml.Node, memo: dict[int, int]) -> int:
    """The values `node` stands for with every alias expanded (an alias is the node object it names)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # met again while being counted: a recursive alias (`&a [*a]`), one value
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded(item, memo) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded(key, memo) + _expanded(value, memo) for key, value in node.value)
    memo[id(node)] = total
    return total


def _build(loader: yaml.SafeLoader, node: yaml.Node, path: tuple[str, ...], out: LocatedYaml, filename: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        first_lines: dict[str, int] = {}  # by text, so `200` and `"200"` count as the same key
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise InventoryError(f"{filename}:{key_node.start_mark.line + 1}: a key must be a plain scalar")
            line = key_node.start_mark.line + 1
            if str(key) in first_lines:
                raise InventoryError(f"{filename}:{line}: {'.'.join(path + (str(key),))}: duplicate key {key!r}"
                                     f" (first at line {first_lines[str(key)]})")
            first_lines[str(key)] = line
            out.lines[path + (str(key),)] = line
            result[key] = _build(loader, value_node, path + (str(key),), out, filename)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            out.lines[path + (str(i),)] = item.start_mark.line + 1
            items.append(_build(loader, item, path + (str(i),), out, filename))
        return items
    return loader.construct_object(node, deep=True)
