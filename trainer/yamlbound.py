"""YAML that cannot blow up: a size limit for the file and a bound on what its aliases expand to.

A 1 KB file of nested aliases (`b: [*a, *a, ...]`, ten levels deep: "billion laughs") names 10^9 values.
PyYAML builds that with shared references, but every walk over the result (validation, a dump, a copy) visits
each of them: gigabytes. So the composed document is measured first, each alias counted as the whole subtree it
repeats, and one past MAX_YAML_NODES values is refused before anything is built. Torch-free, like the config.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import TrainerError

MAX_YAML_BYTES = 1 << 20   # a config (or an inventory) is a few KiB; 1 MiB is far beyond any real one
MAX_YAML_NODES = 200_000   # values after expanding aliases; a real config has a few hundred


class YamlTooLarge(ValueError):
    """The file is over the size limit, or its aliases expand past the node bound."""


def check_size(size: int, what: str) -> None:
    if size > MAX_YAML_BYTES:
        raise YamlTooLarge(f"{what} is larger than the limit of 1 MiB ({MAX_YAML_BYTES} bytes)")


def read_yaml(path: Path, text: str | bytes | None, what: str) -> Any:
    """The YAML document of a file (or of `text`, read from it already), within the bounds; a TrainerError
    naming the file otherwise: unreadable, not UTF-8, not YAML, too large."""
    import yaml

    try:
        raw = read_bounded(path, what) if text is None else text
        return safe_load_bounded(raw.decode("utf-8") if isinstance(raw, bytes) else raw, what)
    except YamlTooLarge as exc:
        raise TrainerError(f"{path}: {exc}") from None
    except OSError as exc:
        raise TrainerError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None  # named once, first
    except UnicodeDecodeError as exc:
        raise TrainerError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
                           "save the config as UTF-8") from None
    except yaml.YAMLError as exc:
        raise TrainerError(f"{path}: invalid YAML: {exc}") from None


def read_bounded(path, what: str) -> bytes:
    """A file's bytes, refusing one over the size limit without reading it all (a FIFO, /dev/zero, a huge file)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_YAML_BYTES + 1)
    check_size(len(data), what)
    return data


def expanded_nodes(node: Any, memo: dict[int, int] | None = None) -> int:
    """How many values a composed YAML node stands for with every alias expanded (an alias is the very node
    object it names, so it is counted once per place it appears; each node's count is computed once)."""
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a node met again while it is being counted is a recursive alias (`&a [*a]`): one value
    total = 1
    if isinstance(node.value, list):  # a sequence (nodes) or a mapping ((key, value) pairs); scalars are str
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                total += expanded_nodes(child, memo)
    memo[key] = total
    return total


def check_expansion(node: Any, what: str) -> None:
    try:
        count = expanded_nodes(node)
    except RecursionError:
        raise YamlTooLarge(f"{what} nests too deeply") from None
    if count > MAX_YAML_NODES:
        raise YamlTooLarge(f"{what} expands to {_shown(count)} values through its aliases; the limit is "
                           f"{MAX_YAML_NODES} (a YAML alias bomb?)")


def safe_load_bounded(text: str, what: str) -> Any:
    """yaml.safe_load of `text`, refusing (YamlTooLarge) a document past the size or the node bound; YAML's
    own errors are raised as they are."""
    import yaml

    check_size(len(text.encode("utf-8", "surrogatepass")), what)
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlTooLarge(f"{what} nests too deeply") from None
        if node is None:
            return None
        check_expansion(node, what)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _shown(count: int) -> str:
    return str(count) if count < 10**12 else f"about 10^{len(str(count)) - 1}"
