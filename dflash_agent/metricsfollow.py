"""The watch agent's follower of a run's metrics.jsonl: the trainer's exact figures beside its human log lines.

A human step line rounds (`(0.3Ktok/s)` for 350 tok/s); the JSON record beside it does not. The agent sends the
new whole lines of `{run dir}/metrics.jsonl` (for the bundled trainer a link to its output_dir's file) as
    {"t": "metrics", "run": ID, "offset": N, "data": BASE64[, "restart": true]}
from byte N; `restart` when the file shrank and is sent again from its start. The controller resumes with
`"metrics": OFFSET` in its follow command (-1 or absent: the last TAIL_BYTES, from a line start).
"""
from __future__ import annotations

import os

from dflash_records.watchwire import MetricsMessage

TAIL_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024


class FollowedMetrics:
    """Where the controller's copy of one run's metrics.jsonl ends (whole lines only)."""

    def __init__(self, path: str, offset: object, tail: int = TAIL_BYTES) -> None:
        self.path = path
        self.offset = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 else -1
        self.tail = tail  # a first look's bytes (-1 offset): the file's last `tail`, from a line start

    def pump(self, run_id: str, send) -> bool:
        """Send one message of new whole lines; True once every whole line has been sent."""
        try:
            handle = open(self.path, "rb")
        except OSError:
            return True  # no metrics.jsonl (not the bundled trainer, or no step yet): nothing missing
        with handle:
            size = os.fstat(handle.fileno()).st_size
            restart = 0 <= size < self.offset
            if restart:
                self.offset = 0
            if self.offset < 0:
                self.offset = _tail_start(handle, size, self.tail)
            if size == self.offset:
                return True
            handle.seek(self.offset)
            data = handle.read(min(MAX_MESSAGE_BYTES, size - self.offset))
        read_all = self.offset + len(data) >= size
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line still being written, or one longer than a message (skipped: no record is that long)
            if not read_all:
                self.offset += len(data)
            return read_all
        send(MetricsMessage(run_id, self.offset, data[:cut], restart))
        self.offset += cut
        return read_all  # what is left after the last newline is a line still being written


def _tail_start(handle, size: int, tail: int) -> int:
    if size <= tail:
        return 0
    handle.seek(size - tail)
    cut = handle.read(tail).find(b"\n")
    return size - tail + (cut + 1 if cut >= 0 else tail)
