"""Turns a trainer's log stream and its metrics.jsonl into typed events.

The stream comes from a live tail: chunks split anywhere (inside a line or a UTF-8 sequence), progress bars
redrawn with `\\r`, ANSI colours, binary garbage, lines of megabytes. None of that may raise, because a parser
that dies blinds the dashboard exactly when a run misbehaves. Events are made from whole lines only, so feeding
a stream in chunks gives the same events as feeding it at once, and a reconnect that resumes mid-line is safe.
"""
from __future__ import annotations

from collections.abc import Iterable

from dflash_records.protocol import SUPERVISOR_LINE_PREFIX
from dflash_records.step import STEP_FIELDS, STEP_LINE, parse_duration
from dflash_records.terminaltext import last_shown, shown_text, without_escapes


# The line parsers and the traceback reader are re-exported: callers import every name from here.
from .lines import (
    PHASES,
    Event,
    ExceptionEvent,
    LogLine,
    PhaseEvent,
    StepEvent,
    parse_generate_line,
    parse_metrics_jsonl_line,
    parse_metrics_jsonl_record,
    parse_phase_line,
    parse_step_line,
    step_from_match,
)
from .tracebacks import (
    CLOSED,
    FOREIGN,
    MAX_FOREIGN_LINES,
    MAX_TRACEBACK_LINES,
    TOOK,
    TRACEBACK_HEADER,
    TRACEBACK_MARK,
    OpenTraceback,
    standalone_exception,
    traceback_prefix,
)

__all__ = [
    "CLOSED", "FOREIGN", "MAX_FOREIGN_LINES", "MAX_LINE_BYTES", "MAX_TRACEBACK_LINES", "PHASES", "STEP_FIELDS",
    "TOOK", "TRACEBACK_MARK", "Event", "ExceptionEvent", "LogLine", "LogParser", "PhaseEvent", "StepEvent",
    "parse_duration", "parse_generate_line", "parse_lines", "parse_metrics_jsonl_line", "parse_metrics_jsonl_record", "parse_phase_line",
    "parse_step_line", "standalone_exception",
]

MAX_LINE_BYTES = 64 * 1024
JSON_RECORD = "{\""  # how a line of JSON Lines output begins; no trainer line does

# ---------------------------------------------------------------------------------------------- the stream

class LogParser:
    """Incremental parser of one log stream: `feed` bytes as they come, `flush` at the end of the stream.

    A partial last line is kept until its newline arrives. A traceback is emitted once the line after it shows
    that no chained block follows; `settle()` emits it without waiting, for a stream that has gone quiet.
    Every line belongs to exactly one event and `line_no` counts lines from 1. Events come in the order they
    complete: a step line printed by another thread in the middle of a traceback comes before the traceback.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._cap = max(1, max_line_bytes)
        self.line_count = 0
        self._segment = bytearray()  # the current line's `\r` segment so far, at most _cap bytes
        self._segment_truncated = False
        self._shown: tuple[str, bool] | None = None  # the line's last finished segment that shows anything
        self._in_line = False
        self._traceback: OpenTraceback | None = None
        self._header: tuple[int, str] | None = None  # `Exception in thread ...:`, waiting for its traceback

    def feed(self, data: bytes | bytearray | memoryview | str) -> list[Event]:
        out: list[Event] = []
        data = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
        first = data.find(b"\n")
        if first < 0:
            self._append_partial(data)
            return out
        start = 0
        if self._in_line:
            self._append_partial(data[:first])
            self._emit_partial(out)
            start = first + 1
        last = data.rfind(b"\n")
        if start <= last:
            self._emit_block(data[start:last], out)
        self._append_partial(data[last + 1:])
        return out

    def flush(self) -> list[Event]:
        """End of stream: the partial last line becomes a line, and an open traceback is emitted as it is."""
        out: list[Event] = []
        if self._in_line:
            self._emit_partial(out)
        self._close_exception(out)
        return out

    def settle(self) -> list[Event]:
        """The stream went quiet: emit a traceback that has reached its exception line (a chained block would
        have followed at once) and a lone `Exception in thread` header. The partial line stays partial."""
        out: list[Event] = []
        if self._header is not None or (self._traceback is not None and self._traceback.finished):
            self._close_exception(out)
        return out

    # -- bytes to lines

    def _append_partial(self, piece: bytes) -> None:
        if not piece:
            return
        self._in_line = True
        if b"\r" not in piece:
            self._extend_segment(piece)
            return
        first, *finished, last = piece.split(b"\r")
        self._extend_segment(first)
        self._finish_segment()
        shown = last_shown(finished, self._cap)  # only the last one that shows anything can matter
        if shown[0]:
            self._shown = shown
        self._segment, self._segment_truncated = bytearray(last[:self._cap]), len(last) > self._cap

    def _extend_segment(self, piece: bytes) -> None:
        room = self._cap - len(self._segment)
        self._segment += piece[:room]
        self._segment_truncated |= len(piece) > room

    def _finish_segment(self) -> None:
        text = shown_text(bytes(self._segment))
        if text:
            self._shown = (text, self._segment_truncated)
        self._segment, self._segment_truncated = bytearray(), False

    def _emit_partial(self, out: list[Event]) -> None:
        self._finish_segment()
        text, truncated = self._shown or ("", False)
        self._shown, self._in_line = None, False
        self.line_count += 1
        self._take(text, truncated, out)

    def _emit_block(self, block: bytes, out: list[Event]) -> None:
        if len(block) > self._cap:  # some line may need truncating: go line by line, on bytes
            for raw in block.split(b"\n"):
                self._emit_line_bytes(raw, out)
            return
        text = without_escapes(block.decode("utf-8", "replace"))
        has_cr = "\r" in text
        step_line = STEP_LINE.fullmatch
        line_no = self.line_count
        quiet = self._traceback is None and self._header is None  # no traceback or header being read
        for line in text.split("\n"):
            line_no += 1
            if has_cr and "\r" in line:
                line = shown_text(line)
            # the fast path of _classify for the line that makes up nearly all of a training log
            if line[:1] == "[" and quiet:
                match = step_line(line)
                event = step_from_match(match, line, line_no) if match is not None else None
                if event is not None:
                    out.append(event)
                    continue
            self.line_count = line_no
            self._take(line, False, out)
            quiet = self._traceback is None and self._header is None
        self.line_count = line_no

    def _emit_line_bytes(self, raw: bytes, out: list[Event]) -> None:
        text, truncated = last_shown(raw.split(b"\r"), self._cap)
        self.line_count += 1
        self._take(text, truncated, out)

    # -- lines to events

    def _take(self, text: str, truncated: bool, out: list[Event]) -> None:
        line_no = self.line_count
        if text.startswith(SUPERVISOR_LINE_PREFIX):
            # the supervisor's own line (`attempt 1/5 failed ... (RuntimeError: ...); restarting`): never the
            # workload's exception, though it quotes one; what the workload wrote before it is over
            self._close_exception(out)
            out.append(LogLine(line_no, text, truncated))
            return
        if self._traceback is None and self._header is None:
            self._classify(text, line_no, truncated, out)
        elif self._header is not None:
            self._take_after_header(text, line_no, truncated, out)
        else:
            self._take_in_traceback(text, line_no, truncated, out)

    def _classify(self, text: str, line_no: int, truncated: bool, out: list[Event]) -> None:
        if text.startswith(JSON_RECORD):
            # a JSON record is another program's data, e.g. a headless watch's alerts, which quote other runs'
            # step lines and tracebacks: taken as this run's own they made a notifier look like a training run
            # (and its alerts about exceptions alert again about themselves)
            out.append(LogLine(line_no, text, truncated))
            return
        if " step=" in text:
            step = parse_step_line(text, line_no)
            if step is not None:
                out.append(step)
                return
        if "] generate answered=" in text:
            progress = parse_generate_line(text, line_no)
            if progress is not None:
                out.append(progress)
                return
        mark = text.find(TRACEBACK_MARK)
        if mark >= 0:
            self._close_exception(out)  # one left open by interleaved output ends where another begins
            self._start_traceback(line_no, [text], traceback_prefix(text[:mark]))
        elif "Exception" in text or "Error:" in text:
            if TRACEBACK_HEADER.fullmatch(text):
                self._close_exception(out)
                self._header = (line_no, text)
            else:
                out.append(standalone_exception(text, line_no))
        else:
            out.append(parse_phase_line(text, line_no) or LogLine(line_no, text, truncated))

    def _start_traceback(self, line_no: int, lines: list[str], prefix: str) -> None:
        self._traceback = OpenTraceback(line_no, lines, prefix)

    def _take_after_header(self, text: str, line_no: int, truncated: bool, out: list[Event]) -> None:
        header_line_no, header = self._header  # type: ignore[misc]
        self._header = None
        mark = text.find(TRACEBACK_MARK)
        if mark >= 0:
            self._start_traceback(header_line_no, [header, text], traceback_prefix(text[:mark]))
            return
        out.append(standalone_exception(header, header_line_no))
        self._classify(text, line_no, truncated, out)

    def _take_in_traceback(self, text: str, line_no: int, truncated: bool, out: list[Event]) -> None:
        verdict = self._traceback.take(text, line_no)  # type: ignore[union-attr]
        if verdict == TOOK:
            return
        if verdict == CLOSED:
            self._close_exception(out)
        self._classify(text, line_no, truncated, out)

    def _close_exception(self, out: list[Event]) -> None:
        if self._header is not None:
            out.append(standalone_exception(self._header[1], self._header[0]))
            self._header = None
        traceback, self._traceback = self._traceback, None
        if traceback is not None:
            out.append(traceback.event())
            out.extend(LogLine(line_no, blank) for line_no, blank in traceback.held_blanks)



def parse_lines(lines: Iterable[str]) -> list[Event]:
    """Events of a finished log given as lines (without their newlines)."""
    parser = LogParser()
    events = [event for line in lines for event in parser.feed((line + "\n").encode("utf-8", "replace"))]
    return events + parser.flush()


def step_events(log_tail: str | None) -> list[StepEvent]:
    """The step lines (training's and generate's progress) of the end of a log, oldest first."""
    if not log_tail:
        return []
    parser = LogParser()
    events = parser.feed(log_tail.encode("utf-8", "replace")) + parser.flush()
    return [event for event in events if isinstance(event, StepEvent) and event.step is not None]
