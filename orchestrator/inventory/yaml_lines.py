"""YAML loading that remembers the line of every key, and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys; in an inventory that hides a mistake (two entries for one
container), so duplicates are an error here. Lines let validation errors point at `file:line`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import InventoryError


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
    finally:
        loader.dispose()


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
