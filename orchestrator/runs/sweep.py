"""A sweep before it runs: the grid of `--set KEY=V1,V2` values over a trainer config, each point's config, its
run name and output directory, and the sweep's id. Pure: no IO (the config's mapping comes in, YAML goes out).

A sweep's runs are ordinary runs; what makes them one sweep is `sweep_id` and `sweep_values` in each run.json.
How its runs rank (newest held-out τ, then tok/s) is said here too, once, for `sweep report` and the dashboard.
"""
from __future__ import annotations

import copy
import itertools
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError, shorten
from .spec import NAME_CHARS, check_name

MAX_GRID = 256              # runs a sweep starts without --yes
NAME_ROOM = 40              # characters of the sweep's name kept in its id and its runs' names
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class SweepAxis:
    """One `--set KEY=V1,V2,...`: a config key (dotted for a nested one: `loss.ce`) and its values."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class SweepPoint:
    """One run of the grid: its place (1-based), its values by key, its config's mapping."""

    index: int
    values: dict[str, Any]
    config: dict

    def label(self) -> str:
        """`lr=0.0001, loss=ce`: the point as a person reads it."""
        return ", ".join(f"{key}={value_text(value)}" for key, value in self.values.items())


def parse_value(text: str) -> Any:
    """A value as YAML reads a scalar, except that every number is one (`1e-4` is a float, which YAML 1.1
    leaves a string); what is not a scalar stays the text typed."""
    import yaml

    text = text.strip()
    if NUMBER.fullmatch(text):
        return float(text) if any(mark in text for mark in ".eE") else int(text)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) or value is None else text


def parse_sets(sets: list[str], known: Callable[[str], str | None]) -> list[SweepAxis]:
    """Each `KEY=V1,V2` checked: a key of the trainer's config (`known(top key)` says why not), values given, no
    key twice and no value twice. A UsageError names the --set otherwise."""
    if not sets:
        raise UsageError("no --set KEY=V1,V2 given: a sweep needs at least one key to vary")
    axes: dict[str, SweepAxis] = {}
    for item in sets:
        shown = shorten(item, 80)
        key, sep, rest = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"bad --set {shown!r}: use KEY=V1,V2,... (e.g. --set lr=1e-4,3e-4)")
        texts = [part.strip() for part in rest.split(",")]
        if not rest.strip() or any(not part for part in texts):
            raise UsageError(f"bad --set {shown!r}: give {key} one or more values, comma-separated, none empty")
        parts = key.split(".")
        if any(not part for part in parts):
            raise UsageError(f"bad --set {shown!r}: {key!r} is not a config key")
        problem = known(parts[0])
        if problem:
            raise UsageError(f"bad --set {shown!r}: {problem}")
        if key in axes:
            raise UsageError(f"bad --set {shown!r}: {key} is set twice; give all its values in one --set")
        values = tuple(parse_value(text) for text in texts)
        if len({value_text(v) for v in values}) < len(values):
            raise UsageError(f"bad --set {shown!r}: a value is given twice")
        axes[key] = SweepAxis(key, values)
    return list(axes.values())


def grid_size(axes: list[SweepAxis]) -> int:
    return math.prod(len(axis.values) for axis in axes)


def check_size(axes: list[SweepAxis], *, yes: bool) -> int:
    """The grid's size; a UsageError for one past MAX_GRID runs unless the user said --yes."""
    size = grid_size(axes)
    if size > MAX_GRID and not yes:
        counts = " x ".join(str(len(axis.values)) for axis in axes)
        raise UsageError(f"the grid has {size} runs ({counts}), more than {MAX_GRID}: nothing was started; "
                         f"--yes starts them all")
    return size


def grid(base: dict, axes: list[SweepAxis], *, run_name: Callable[[int], str]) -> list[SweepPoint]:
    """Every point of the grid, the last key varying fastest: the config with its values set, and its own
    output directory ({output_dir}/{its run name}), so that no run resumes from another's checkpoints."""
    points = []
    for index, combo in enumerate(itertools.product(*(axis.values for axis in axes)), start=1):
        config = copy.deepcopy(base)
        values = {axis.key: value for axis, value in zip(axes, combo)}
        for key, value in values.items():
            set_key(config, key, value)
        out = str(config.get("output_dir") or "out").rstrip("/")
        config["output_dir"] = f"{out}/{run_name(index)}"
        points.append(SweepPoint(index, values, config))
    return points


def set_key(config: dict, key: str, value: Any) -> None:
    """Set a dotted key: `loss.ce` makes `loss` a mapping where it was not one (a name, or unset)."""
    *path, last = key.split(".")
    node = config
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def config_text(config: dict) -> bytes:
    import yaml

    return yaml.safe_dump(config, sort_keys=False).encode("utf-8")


@dataclass(frozen=True)
class SweepNames:
    """The sweep's id and its runs' names: `sweep-<name>-<6 hex>`, and `<name>-<6 hex>-<index>`."""

    name: str
    short: str

    @classmethod
    def new(cls, name: str | None, config_stem: str) -> SweepNames:
        base = check_name(name) if name else (NAME_CHARS.sub("-", config_stem).strip("-._") or "sweep")
        return cls(base[:NAME_ROOM], secrets.token_hex(3))

    @property
    def sweep_id(self) -> str:
        return f"sweep-{self.name}-{self.short}"

    def run_name(self, index: int) -> str:
        return f"{self.name}-{self.short}-{index}"


def value_text(value: Any) -> str:
    """A value as `--set` would take it back (`0.0001`, `ce`, `true`, `null`)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def rank_key(tau_heldout: float | None, tok_per_s: float | None, run_id: str) -> tuple:
    """How a sweep's runs rank, best first: the newest held-out τ, highest first, then tok/s; a run without one
    after every run with it; the run id breaks ties, so the order is the same on every read."""
    def high_first(value: float | None) -> tuple:
        return (1, 0.0) if value is None or not math.isfinite(value) else (0, -value)

    return (*high_first(tau_heldout), *high_first(tok_per_s), run_id)


__all__ = ["SweepAxis", "SweepPoint", "SweepNames", "parse_sets", "parse_value", "check_size", "grid",
           "config_text", "value_text", "rank_key", "MAX_GRID"]
