"""Where torch.compile's caches live on a target: under its workdir, so the second run of a shape starts warm.

Inductor and Triton cache in /tmp by default, which a container restart (or a tmp cleaner) empties, and which
differs per user. `launch` points both at `{workdir}/.dflash/cache/` unless the user's --env says otherwise;
`doctor` shows how much is there.
"""
from __future__ import annotations

from dflash_records.protocol import KIB, ascii_decimal, state_path

from ..inventory.model import Target

CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
# the directory's size in bytes (du -sk: POSIX, busybox too); 0 where nothing was cached yet
SIZE_SCRIPT = 'if [ -d "$1" ]; then du -sk -- "$1" | cut -f1; else echo 0; fi'


def cache_root(target: Target) -> str:
    return state_path(target.workdir, "cache")


def cache_env(target: Target) -> dict[str, str]:
    """The environment a run gets for its compile caches (the user's --env is applied over it)."""
    return {name: f"{cache_root(target)}/{sub}" for name, sub in CACHE_VARS.items()}


def size_argv(target: Target) -> list[str]:
    return ["sh", "-c", SIZE_SCRIPT, "sh", cache_root(target)]


def parse_size_kib(stdout: str) -> int | None:
    """Bytes from du -sk's output (KiB), None when it is not a number."""
    kib = ascii_decimal((stdout.strip().splitlines()[-1:] or [""])[0])
    return kib * KIB if kib is not None else None
