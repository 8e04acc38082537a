"""The sha256 of a file, read in chunks: the one way every side hashes what `pull` moves.

The trainer writes each checkpoint file's into manifest.json, the agent lists the files `pull` fetches with theirs
(a growing log's of its first bytes too), and the controller checks what it received against them and resumes a
cut transfer from the hash of the bytes it kept: all count the same bytes the same way.
"""
from __future__ import annotations

import hashlib

HASH_CHUNK = 4 * 1024 * 1024
# a checkpoint's list of its files' sizes and sha256s, the last file its save writes: what `pull` checks against
MANIFEST_FILE = "manifest.json"


def sha256_state(path, size: int | None = None):
    """The sha256 object fed with the first `size` bytes of the file at `path` (all of it when None; fewer where
    the file is shorter; nothing is opened for 0): a transfer that resumes goes on feeding it."""
    digest = hashlib.sha256()
    if size == 0:
        return digest
    left = -1 if size is None else size
    with open(path, "rb") as handle:
        while left:
            chunk = handle.read(HASH_CHUNK if left < 0 else min(HASH_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left = left - len(chunk) if left > 0 else left
    return digest


def sha256_of(path, size: int | None = None) -> str:
    """The hex sha256 of the first `size` bytes of the file at `path` (all of it when None)."""
    return sha256_state(path, size).hexdigest()
