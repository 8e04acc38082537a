"""The watch agent's follower of a run's metrics.jsonl: the trainer's exact figures beside its human log lines.

A human step line rounds (`(0.3Ktok/s)` for 350 tok/s); the JSON record beside it does not. The agent sends the
new whole lines of `{run dir}/metrics.jsonl` (for the bundled trainer a link to its output_dir's file) as
    {"t": "metrics", "run": ID, "offset": N, "data": BASE64[, "restart": true]}
from byte N; `restart` when the file shrank and is sent again from its start. The controller resumes with
`"metrics": OFFSET` in its follow command (-1 or absent: the last TAIL_BYTES, from a line start).
"""
from __future__ import annotations

import base64
import os

from .protocol import MSG_METRICS

TAIL_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024


class FollowedMetrics:
    """Where the controller's copy of one run's metrics.jsonl ends (whole lines only)."""

    def __init__(self, path: str, offset: object) -> None:
        self.path = path
        self.offset = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 else -1

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
                self.offset = _tail_start(handle, size)
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
        message = {"t": MSG_METRICS, "run": run_id, "offset": self.offset,
                   "data": base64.b64encode(data[:cut]).decode("ascii")}
        send(dict(message, restart=True) if restart else message)
        self.offset += cut
        return read_all  # what is left after the last newline is a line still being written


def _tail_start(handle, size: int) -> int:
    if size <= TAIL_BYTES:
        return 0
    handle.seek(size - TAIL_BYTES)
    cut = handle.read(TAIL_BYTES).find(b"\n")
    return size - TAIL_BYTES + (cut + 1 if cut >= 0 else TAIL_BYTES)
