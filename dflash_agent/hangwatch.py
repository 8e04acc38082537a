"""The hang watchdog's eyes: it follows one attempt's part of the run's log and notes its step lines (when each
came, the last step) and its last exception line. An attempt that printed steps and then none for longer than
its bound is hung: HANG_MULTIPLE times its median step interval, at least HANG_FLOOR_S, unless the run sets
its own bound (--hang-timeout; 0 turns the watchdog off). Before a step line nothing is judged: start-up
(loading models, compiling) has no interval to compare with.

Silence is judged by what the log holds now: each look reads to the log's end (in READ_CHUNK pieces, for at
most READ_BUDGET_S), and while a burst of output is still unread nothing is judged. A look that read a fixed
amount fell behind a 100 MB burst and ended a run stepping every second as hung.
"""
from __future__ import annotations

import collections
import os
import time

from dflash_records.terminaltext import failure_text, shown_text, step_number

HANG_MULTIPLE = 20.0
HANG_FLOOR_S = 600.0
READ_CHUNK = 1024 * 1024   # one read of the log
READ_BUDGET_S = 1.0        # the longest one look reads: a flood must not stall the supervisor (its kill)
MAX_LINE = 64 * 1024       # a longer line is judged by its first MAX_LINE bytes
# What a step line or an exception line holds, as written or with an escape sequence inside (ESC, or a C1 control
# in UTF-8): a piece of log without any of them has neither, and is passed over without being split into lines.
LINE_CLUES = (b"step=", b"Error", b"Exception", b"Interrupt", b"\x1b", b"\xc2")
INTERVALS_KEPT = 64


class AttemptLog:
    def __init__(self, path: str, offset: int) -> None:
        self.path = path
        self.offset = offset
        self.partial = b""
        self.step_times = collections.deque(maxlen=INTERVALS_KEPT + 1)
        self.last_step = None
        self.exception = None
        self.behind = False  # the last look left part of the log unread (its budget ran out)

    def poll(self, now: float) -> None:
        """Read what the log gained since the last look, to its end unless that takes over READ_BUDGET_S."""
        started = time.monotonic()
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:  # truncated under us: start over at its end
                    self.offset = 0
                handle.seek(self.offset)
                while True:
                    data = handle.read(READ_CHUNK)
                    self._take(data, now)
                    if len(data) < READ_CHUNK or time.monotonic() - started >= READ_BUDGET_S:
                        break
                self.behind = os.fstat(handle.fileno()).st_size > self.offset
        except OSError:
            return

    def _take(self, data: bytes, now: float) -> None:
        self.offset += len(data)
        data = self.partial + data
        if not any(clue in data for clue in LINE_CLUES):
            self.partial = data[data.rfind(b"\n") + 1:][:MAX_LINE]
            return
        lines = data.split(b"\n")
        self.partial = lines.pop()[:MAX_LINE]
        for line in lines:
            self._line(shown_text(line[:MAX_LINE]), now)

    def _line(self, text: str, now: float) -> None:
        step = step_number(text)
        if step is not None:
            self.step_times.append(now)
            self.last_step = step
            return
        failure = failure_text(text)
        if failure is not None:
            self.exception = failure[:500]

    def median_interval(self) -> float | None:
        times = list(self.step_times)
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return gaps[len(gaps) // 2] if gaps else None

    def bound(self, setting: float | None) -> float | None:
        """Seconds without a step after which this attempt is hung; None while it cannot be judged."""
        if not self.step_times or setting == 0:
            return None
        if setting is not None:
            return setting
        median = self.median_interval()
        return max(HANG_FLOOR_S, HANG_MULTIPLE * median) if median is not None else HANG_FLOOR_S

    def hung(self, now: float, setting: float | None) -> float | None:
        """How long it has been silent, once that is past its bound; None otherwise, and while part of the log is
        still unread (a step line may be in it)."""
        bound = self.bound(setting)
        if bound is None or self.behind:
            return None
        silent = now - self.step_times[-1]
        return silent if silent > bound else None
