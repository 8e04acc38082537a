"""The command-line values several commands take, checked and converted: --gpus lists, --env pairs, seconds.

A bad value is a UsageError naming the option, with the user's input shortened, before anything is contacted.
"""
from __future__ import annotations

import math

import typer

from dflash_records.protocol import MAX_GPU_INDEX, NO_GPUS, ascii_decimal, env_pair

from ..errors import UsageError, shorten


def parse_gpus(text: str | None) -> list[int] | None:
    """`0,1,3` or `0-7` (or a mix: `0-3,6`) into sorted distinct indices, each at most MAX_GPU_INDEX
    (checked before a range is expanded: `0-99999999` is refused at once, not after building it); `none` into
    [] (a run that uses no GPU: it sees none and holds none)."""
    if text is None:
        return None
    if text.strip().lower() == NO_GPUS:
        return []
    shown = shorten(text, 60)
    indices: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        start, stop = ascii_decimal(lo), ascii_decimal(hi) if sep else ascii_decimal(lo)
        if start is None or stop is None:
            raise UsageError(f"bad --gpus {shown!r}: use indices like 0,1, a range like 0-7, or none")
        if stop < start:
            raise UsageError(f"bad --gpus {shown!r}: range {shorten(part, 40)} runs backwards")
        if stop > MAX_GPU_INDEX:
            raise UsageError(f"bad --gpus {shown!r}: GPU indices go up to {MAX_GPU_INDEX}")
        indices.update(range(start, stop + 1))
    return sorted(indices)


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs or []:
        try:
            key, value = env_pair(pair)
        except ValueError as exc:
            raise UsageError(f"bad --env {shorten(pair, 80)!r}: {exc}") from None
        env[key] = value
    return env


def number_in(low: float, high: float | None = None):
    """An option callback for a number that must lie in [low, high]: one wording for every value refused
    (`nan`, `inf`, `-1`, a 20-digit count), which a typer `min=` gave in two (its own range message, and this
    module's for what passed it). The range is also said in the option's help, not as typer's `[x>=0]` type
    noise."""
    bounds = f"of at least {_number(low)}" if high is None else f"from {_number(low)} to {_number(high)}"

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and low <= value <= (math.inf if high is None else high)):
            raise typer.BadParameter(f"expected a number {bounds}, got {shorten(_number(value), 40)}")
        return value

    return check


def _number(value: float) -> str:
    """A bound or a value as typed: whole numbers in full (`1000000000000`, not `1e+12`), others as %g."""
    if isinstance(value, int):
        return str(value)
    return f"{value:g}"
