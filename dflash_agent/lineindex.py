"""`lines`: lines [start, stop) of a run's train.log for the full-log screen, through a sparse line index.

The index keeps the byte offset of every EVERY-th line and is cached in the run directory; each call scans only
the bytes appended since the last one (bytes.count over big chunks), so asking for the end of a 1 GB log reads
the file once, ever, and then only the few KiB that hold the lines asked for.
"""
from __future__ import annotations

import json
import os

from dflash_records.answers import LinesAnswer
from dflash_records.terminaltext import shown_text

from .rundir import existing_run, write_json_atomic

EVERY = 1000
CHUNK = 16 * 1024 * 1024
READ_BLOCK = 1024 * 1024
WINDOW = 64 * 1024
MAX_LINES = 10000
INDEX_NAME = ".lines-index.json"


def nth_newline(buf: bytes, n: int, start: int, end: int) -> int:
    """Index in buf of the n-th (1-based) newline of buf[start:end]; the caller knows there are at least n."""
    while end - start > 4096:  # halve by counting (C speed) instead of walking newline by newline
        middle = (start + end) // 2
        found = buf.count(b"\n", start, middle)
        if found >= n:
            end = middle
        else:
            n -= found
            start = middle
    position = start - 1
    for _ in range(n):
        position = buf.index(b"\n", position + 1, end)
    return position


class LineIndex:
    """marks[k] = byte offset where line k*EVERY starts; `lines` newlines lie before byte `scanned`."""

    def __init__(self, ino: int = 0, scanned: int = 0, lines: int = 0, marks: list | None = None) -> None:
        self.ino = ino
        self.scanned = scanned
        self.lines = lines
        self.marks = marks if marks is not None else [0]

    @classmethod
    def load(cls, path: str) -> "LineIndex":
        try:
            with open(path) as handle:
                data = json.load(handle)
            return cls(int(data["ino"]), int(data["scanned"]), int(data["lines"]), [int(m) for m in data["marks"]])
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def save(self, path: str) -> None:
        """Keep the index for the next call; it is only a cache, so a full disk just means a rescan."""
        try:
            write_json_atomic(path, {"ino": self.ino, "scanned": self.scanned, "lines": self.lines,
                                     "every": EVERY, "marks": self.marks})
        except OSError:
            pass

    def extend(self, handle, ino: int, size: int) -> bool:
        """Scan what was appended since the last call; start over for a replaced or truncated file."""
        if ino != self.ino or size < self.scanned:
            self.__init__(ino)
        if size == self.scanned:
            return False
        handle.seek(self.scanned)
        while self.scanned < size:
            chunk = handle.read(min(CHUNK, size - self.scanned))
            if not chunk:
                break
            self._scan(chunk)
        return True

    def _scan(self, chunk: bytes) -> None:
        # Count window by window; only the window holding the next mark is searched (by halving), so every
        # byte is counted about once however many marks the chunk holds.
        position, end = 0, len(chunk)
        need = len(self.marks) * EVERY - self.lines  # newlines before the line of the next mark starts
        while position < end:
            window_end = min(end, position + WINDOW)
            found = chunk.count(b"\n", position, window_end)
            if found < need:
                need -= found
                self.lines += found
                position = window_end
                continue
            newline = nth_newline(chunk, need, position, window_end)
            self.marks.append(self.scanned + newline + 1)
            self.lines += need
            position, need = newline + 1, EVERY
        self.scanned += end


def read_lines(runs_dir: str, run_id: str, start: int, stop: int) -> LinesAnswer:
    paths = existing_run(runs_dir, run_id)
    start = max(0, start)
    stop = max(start, min(stop, start + MAX_LINES))
    index_path = os.path.join(paths.dir, INDEX_NAME)
    try:
        handle = open(paths.log, "rb")
    except FileNotFoundError:
        return LinesAnswer(ok=True, run_id=run_id, total=0, start=start, lines=(), size=0)
    with handle:
        info = os.fstat(handle.fileno())
        index = LineIndex.load(index_path)
        if index.extend(handle, info.st_ino, info.st_size):
            try:
                index.save(index_path)
            except OSError:
                pass  # a read-only run dir: the answer is still right, only the next call rescans
        has_partial = index.scanned > 0 and _last_byte(handle, index.scanned) != b"\n"
        # the partial last line counts as a line (it shows on screen), and the index knows its newline count
        total = index.lines + (1 if has_partial else 0)
        lines = _collect(handle, index, start, min(stop, total))
    return LinesAnswer(ok=True, run_id=run_id, total=total, start=start, lines=tuple(lines), size=index.scanned)


def _last_byte(handle, size: int) -> bytes:
    handle.seek(size - 1)
    return handle.read(1)


def _collect(handle, index: LineIndex, start: int, stop: int) -> list:
    if stop <= start:
        return []
    mark = min(start // EVERY, len(index.marks) - 1)
    handle.seek(index.marks[mark])
    skip, wanted = start - mark * EVERY, stop - start
    out, pending, position = [], b"", index.marks[mark]
    while len(out) < wanted and position < index.scanned:
        block = handle.read(min(READ_BLOCK, index.scanned - position))
        if not block:
            break
        position += len(block)
        parts = (pending + block).split(b"\n")
        pending = parts.pop()
        for raw in parts:
            if skip:
                skip -= 1
                continue
            out.append(shown_text(raw))
            if len(out) == wanted:
                return out
    if pending and not skip and len(out) < wanted:
        out.append(shown_text(pending))
    return out
