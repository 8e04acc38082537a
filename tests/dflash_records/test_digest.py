"""sha256_of: the one hash of a file that the trainer's manifest, the agent's pull plan and the controller's check
of what it received share."""
from __future__ import annotations

import hashlib
import os

from dflash_records import digest
from dflash_records.digest import sha256_of, sha256_state


def test_a_file_or_its_first_bytes_hash_as_their_bytes_do_across_chunk_boundaries(tmp_path, monkeypatch) -> None:
    data = os.urandom(10_000)
    path = tmp_path / "training_state.pt"
    path.write_bytes(data)
    monkeypatch.setattr(digest, "HASH_CHUNK", 4096)   # every size below straddles chunks
    for size in (None, 1, 4095, 4096, 4097, 9999, 10_000, 20_000):
        expected = hashlib.sha256(data if size is None else data[:size]).hexdigest()
        assert sha256_of(path, size) == sha256_of(str(path), size) == expected, size


def test_a_resumed_transfer_goes_on_from_the_state_of_the_bytes_it_kept(tmp_path) -> None:
    path = tmp_path / "train.log.part"
    path.write_bytes(b"kept bytes")
    state = sha256_state(path, 4)
    state.update(b" and the rest")
    assert state.hexdigest() == hashlib.sha256(b"kept and the rest").hexdigest()
    # nothing kept: nothing to open (a transfer from the start has no .part yet)
    assert sha256_of(tmp_path / "absent", 0) == hashlib.sha256().hexdigest()
