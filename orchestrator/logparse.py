"""Turns a trainer's log stream and its metrics.jsonl into typed events.

The stream comes from a live tail: chunks split anywhere (inside a line or a UTF-8 sequence), progress bars
redrawn with `\\r`, ANSI colours, binary garbage, lines of megabytes. None of that may raise, because a parser
that dies blinds the dashboard exactly when a run misbehaves. Events are made from whole lines only, so feeding
a stream in chunks gives the same events as feeding it at once, and a reconnect that resumes mid-line is safe.
"""
from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

MAX_LINE_BYTES = 64 * 1024
# A traceback longer than this keeps its head and its tail: the cause is at the end, the entry point at the top.
MAX_TRACEBACK_LINES = 2000
# Lines of other output allowed inside an unfinished traceback (threads interleave) before it is given up.
MAX_FOREIGN_LINES = 50


@dataclass(frozen=True, slots=True)
class LogLine:
    line_no: int
    text: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class PhaseEvent:
    """A start-up or lifecycle line. `phase` is one of PHASES; only the fields that phase has are set."""

    line_no: int | None
    text: str
    phase: str
    path: str | None = None  # loading_dataset
    n_samples: int | None = None  # dataset_loaded
    n_batches: int | None = None  # batches_per_epoch, bucket
    batch_min: int | None = None  # batches_per_epoch: samples per batch
    batch_max: int | None = None
    batch_avg: float | None = None
    index: int | None = None  # bucket, target_loading
    lo: int | None = None  # bucket: [lo, hi) sequence lengths
    hi: int | None = None
    pct: float | None = None  # bucket: share of the epoch's batches
    n_targets: int | None = None  # loading_targets
    device: str | None = None  # target_loading


PHASES = ("loading_dataset", "dataset_loaded", "batches_per_epoch", "bucket", "loading_targets",
          "target_loading", "training", "finished")


@dataclass(frozen=True)
class StepEvent:
    """One step line (or metrics.jsonl record). Any field may be None: `partial` says some were missing,
    as in a line cut off mid-way. `line_no` is None for metrics.jsonl records."""

    line_no: int | None
    text: str
    partial: bool
    elapsed_s: float | None = None
    step: int | None = None
    loss: float | None = None
    acc: float | None = None
    streak: float | None = None
    lr: float | None = None
    noise: float | None = None
    tgt_bps: float | None = None
    dft_bps: float | None = None
    tok_per_s: float | None = None
    q_pre: tuple[int, ...] | None = None
    q_hs: tuple[int, ...] | None = None
    epoch: float | None = None
    eta_s: float | None = None


_new_object = object.__new__
_set_attribute = object.__setattr__
STEP_FIELDS = ("elapsed_s", "step", "loss", "acc", "streak", "lr", "noise", "tgt_bps", "dft_bps",
               "tok_per_s", "q_pre", "q_hs", "epoch", "eta_s")


@dataclass(frozen=True, slots=True)
class ExceptionEvent:
    """A whole Python traceback (chained blocks included) or one standalone line naming an exception or error."""

    line_no: int
    text: str
    exc_type: str | None
    message: str
    n_lines: int
    is_traceback: bool


Event = LogLine | PhaseEvent | StepEvent | ExceptionEvent

# ---------------------------------------------------------------------------------------------- values

_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)d)?(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s)?")
_TOK_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}


@lru_cache(maxsize=4096)
def parse_duration(text: str) -> float | None:
    """`45s`, `6m`, `1h23m`, `3h07m`, `12.0d`, `3.5h` -> seconds; None for `?` or anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = match.groups()
    if days is None and hours is None and minutes is None and seconds is None:
        return None
    return (float(days or 0) * 86400.0 + float(hours or 0) * 3600.0 + float(minutes or 0) * 60.0
            + float(seconds or 0))


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@lru_cache(maxsize=4096)
def _queue_depths(text: str) -> tuple[int, ...]:
    # queues sit at the same depths for long stretches (full, or empty): the same few strings recur
    return tuple(map(int, text.split(","))) if text else ()


def _depths(text: str) -> tuple[int, ...] | None:
    try:
        return _queue_depths(text.strip())
    except ValueError:
        return None


def _tok_per_s(number: str, scale: str) -> float | None:
    value = _float(number)
    return None if value is None else value * _TOK_SCALE[scale]


# ---------------------------------------------------------------------------------------------- step lines

_STEP_LINE = re.compile(
    r"\[([^\]]*)\] step=(\d+) loss=(\S+) acc=(\S+) streak=(\S+) lr=(\S+) noise=(\S+) \| "
    r"tgt=(\S+)b/s dft=(\S+)b/s \((\S+?)([KMG]?)tok/s\) \| q_pre=\[([^\]]*)\] q_hs=\[([^\]]*)\] \| "
    r"epoch~(\S+) ETA=(\S+)"
)
_STEP_KEYS = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|epoch|ETA)[=~]([^\s|()\[\]]+)")
_STEP_QUEUES = re.compile(r"\b(q_pre|q_hs)=\[([\d,\s]*)\]")
_STEP_TOKENS = re.compile(r"\(([\d.]+(?:[eE][-+]?\d+)?)([KMG]?)tok/s\)")
_STEP_ELAPSED = re.compile(r"\[(\d[\d.dhms]*)\] step=")
_STEP_CONVERT = {"step": _int, "loss": _float, "acc": _float, "streak": _float, "lr": _float, "noise": _float,
                 "epoch": _float, "ETA": parse_duration,
                 "tgt": lambda v: _float(v.removesuffix("b/s")), "dft": lambda v: _float(v.removesuffix("b/s"))}
_STEP_NAMES = {"tgt": "tgt_bps", "dft": "dft_bps", "ETA": "eta_s"}


def parse_step_line(text: str, line_no: int | None = None) -> StepEvent | None:
    """A step line in the trainer's format, or what a cut-off one still holds (partial); None if not one."""
    match = _STEP_LINE.fullmatch(text)
    if match is not None:
        event = _step_from_match(match, text, line_no)
        if event is not None:
            return event
    if "loss=" not in text and _STEP_ELAPSED.search(text) is None:
        return None  # `saved checkpoint step=100` mentions a step, it is not a step line
    return _step_from_fields(text, line_no)


def _step_from_match(match: re.Match[str], text: str, line_no: int | None) -> StepEvent | None:
    (elapsed, step, loss, acc, streak, lr, noise, tgt, dft, tokens, scale, q_pre, q_hs, epoch, eta) = match.groups()
    try:
        fields = {
            "line_no": line_no, "text": text, "partial": False, "elapsed_s": parse_duration(elapsed),
            "step": int(step), "loss": float(loss), "acc": float(acc), "streak": float(streak), "lr": float(lr),
            "noise": float(noise), "tgt_bps": float(tgt), "dft_bps": float(dft),
            "tok_per_s": float(tokens) * _TOK_SCALE[scale],
            "q_pre": _queue_depths(q_pre), "q_hs": _queue_depths(q_hs),
            "epoch": float(epoch), "eta_s": parse_duration(eta),
        }
    except ValueError:
        return None  # the shape matched but a value did not: let the tolerant reader take what is good
    # The generated __init__ of a frozen dataclass sets each field through object.__setattr__, which is a
    # quarter of the time a step line costs; filling __dict__ at once gives the same object (tests compare).
    event = _new_object(StepEvent)
    _set_attribute(event, "__dict__", fields)
    return event


def _step_from_fields(text: str, line_no: int | None) -> StepEvent | None:
    fields: dict[str, object] = {}
    for match in _STEP_KEYS.finditer(text):
        key, value = match.groups()
        # a value the line ends on may have been cut mid-number; ETA alone legitimately ends a line
        if match.end() == len(text) and key != "ETA":
            continue
        fields[_STEP_NAMES.get(key, key)] = _STEP_CONVERT[key](value)
    if fields.get("step") is None:
        return None
    for match in _STEP_QUEUES.finditer(text):
        fields[match.group(1)] = _depths(match.group(2))
    tokens = _STEP_TOKENS.search(text)
    if tokens is not None:
        fields["tok_per_s"] = _tok_per_s(*tokens.groups())
    elapsed = _STEP_ELAPSED.search(text)
    if elapsed is not None:
        fields["elapsed_s"] = parse_duration(elapsed.group(1))
    partial = any(fields.get(name) is None for name in STEP_FIELDS if name != "eta_s") or "eta_s" not in fields
    return StepEvent(line_no, text, partial, **fields)


# ---------------------------------------------------------------------------------------------- metrics.jsonl

_JSON_NAMES = {"tgt_batches_per_s": "tgt_bps", "dft_batches_per_s": "dft_bps"}


def parse_metrics_jsonl_line(line: str | bytes) -> StepEvent | None:
    """One line of metrics.jsonl -> a StepEvent, or None when it is not a step record (or not JSON at all).
    The writer stores NaN as null and infinities as "inf"/"-inf"; a null metric therefore reads as NaN."""
    try:
        record = json.loads(line)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("event", "step") != "step" or "step" not in record:
        return None
    fields = {_JSON_NAMES.get(key, key): value for key, value in record.items()}
    values = {name: _json_value(name, fields[name]) for name in STEP_FIELDS if name in fields}
    partial = any(values.get(name) is None for name in STEP_FIELDS if name != "eta_s")
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return StepEvent(None, text.rstrip("\r\n"), partial, **values)


_JSON_PHASES = {"start": "training", "finished": "finished"}


def parse_metrics_jsonl_record(line: str | bytes) -> StepEvent | PhaseEvent | None:
    """Like parse_metrics_jsonl_line, and the writer's lifecycle records too: `start` -> the training phase,
    `finished` -> finished. Other records (checkpoint, resume) and garbage give None."""
    step = parse_metrics_jsonl_line(line)
    if step is not None:
        return step
    try:
        record = json.loads(line)
    except (ValueError, TypeError, RecursionError):
        return None
    event = record.get("event") if isinstance(record, dict) else None
    phase = _JSON_PHASES.get(event) if isinstance(event, str) else None
    if phase is None:
        return None
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return PhaseEvent(None, text.rstrip("\r\n"), phase)


def _json_value(name: str, value: object) -> object:
    if name in ("q_pre", "q_hs"):
        ok = isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in value)
        return tuple(value) if ok else None
    if value is None:
        return None if name in ("eta_s", "step", "elapsed_s") else math.nan
    if isinstance(value, str):
        value = _float(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if name == "step":
        if isinstance(value, int):
            return value
        return int(value) if math.isfinite(value) and value == int(value) else None
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        return math.inf if value > 0 else -math.inf


# ---------------------------------------------------------------------------------------------- start-up lines

_PHASE_LINES = (
    ("loading_dataset", re.compile(r"Loading dataset from (?P<path>.*?)\.\.\.")),
    ("dataset_loaded", re.compile(r"\s*(?P<n_samples>\d+) samples loaded\b.*")),
    ("batches_per_epoch", re.compile(
        r"Batches per epoch: (?P<n_batches>\d+)(?: \(min=(?P<batch_min>\d+) max=(?P<batch_max>\d+)"
        r" avg=(?P<batch_avg>[\d.]+)\))?")),
    ("bucket", re.compile(r"\s*Bucket (?P<index>\d+) \[\s*(?P<lo>\d+),\s*(?P<hi>\d+)\):\s*(?P<n_batches>\d+)"
                          r" batches \(\s*(?P<pct>[\d.]+)%\)")),
    ("loading_targets", re.compile(r"Loading (?P<n_targets>\d+) target models?\.\.\.")),
    ("target_loading", re.compile(r"\s*Target (?P<index>\d+) on (?P<device>\S+?)\.\.\.")),
    ("training", re.compile(r"(?:Starting training|Training started|Training\.\.\.)\b.*")),
    ("finished", re.compile(r"(?:Training (?:finished|complete|completed|done)\b|Finished training\b|Finished:).*")),
)
_PHASE_STARTS = ("Loading", "Batches", "Bucket", "Target", "Start", "Train", "Finish")
_FLOAT_FIELDS = ("batch_avg", "pct")


def parse_phase_line(text: str, line_no: int | None = None) -> PhaseEvent | None:
    stripped = text.lstrip()
    if not stripped.startswith(_PHASE_STARTS) and not stripped[:1].isdigit():
        return None
    for phase, pattern in _PHASE_LINES:
        match = pattern.fullmatch(text.rstrip())
        if match is not None:
            try:
                values = {key: (float(v) if key in _FLOAT_FIELDS else v if key in ("path", "device") else int(v))
                          for key, v in match.groupdict().items() if v is not None}
            except ValueError:  # `avg=1.2.3`: the shape of a start-up line, not its content
                return None
            return PhaseEvent(line_no, text, phase, **values)
    return None


# ---------------------------------------------------------------------------------------------- exceptions

TRACEBACK_MARK = "Traceback (most recent call last):"
_CHAIN_MESSAGES = ("During handling of the above exception, another exception occurred:",
                   "The above exception was the direct cause of the following exception:")
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::(?: (.*))?)?")
_GROUP_EXCEPTION_LINE = re.compile(r"\s*\| ([A-Za-z_][\w.]*)(?::(?: (.*))?)?")  # `  | ExceptionGroup: ...`
_EXCEPTION_SUFFIX = re.compile(r"(?:Error|Exception|Interrupt|Exit)\b")
# Python's threading and finalisers print such a line just before the traceback it introduces.
_TRACEBACK_HEADER = re.compile(r"Exception (?:in thread .*:|ignored in\b.*)")
_BODY, _AFTER_EXCEPTION, _CHAIN = range(3)
TOOK, FOREIGN, CLOSED = "took", "foreign", "closed"


def standalone_exception(text: str, line_no: int) -> ExceptionEvent:
    """`RuntimeError: msg` -> type RuntimeError, message msg; without a `Type:` the message is the line."""
    exc_type, message = None, text.strip()
    match = _EXCEPTION_SUFFIX.search(text)
    if match is not None:
        # walk back over the dotted name by hand: a regex for `[\w.]*Error` backtracks quadratically on long words
        start = match.start()
        while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._"):
            start -= 1
        exc_type = text[start:match.end()]
        if text[match.end():match.end() + 1] == ":" and text[match.end() + 1:].strip():
            message = text[match.end() + 1:].strip()
    return ExceptionEvent(line_no, text, exc_type, message, 1, False)


class _Traceback:
    """One traceback being read, line by line, until the line after its last exception line shows it ended."""

    def __init__(self, line_no: int, lines: list[str], prefix: str) -> None:
        self.line_no = line_no
        self.prefix = prefix  # e.g. torchrun's `[rank0]: `, which every line of this traceback carries
        self.head = list(lines)
        self.tail: deque[str] = deque(maxlen=MAX_TRACEBACK_LINES // 2)
        self.n_lines = len(lines)
        self.omitted = 0
        self.state = _BODY
        self.held_blanks: list[tuple[int, str]] = []  # after an exception line: part of a chain, or not
        self.foreign_run = 0
        self.exc_type: str | None = None
        self.message = ""
        # an exception group's traceback is indented all through, its exception lines included
        self.group = "Exception Group" in lines[-1]

    def take(self, text: str, line_no: int) -> str:
        """TOOK: the line is part of this traceback; FOREIGN: other output interleaved with it; CLOSED: the
        traceback ended before this line."""
        if self.prefix and not text.startswith(self.prefix):
            return CLOSED if self.state != _BODY else self._foreign()
        body = text[len(self.prefix):]
        if self.state == _BODY:
            return self._take_body(text, body, line_no)
        if self.state == _AFTER_EXCEPTION:
            return self._take_after_exception(text, body, line_no)
        return self._take_chain(text, body)

    def _take_body(self, text: str, body: str, line_no: int) -> str:
        if body[:1] in ("", " ", "\t") or TRACEBACK_MARK in body:
            self._keep(text)
            self.group |= "Exception Group" in body
            if self.group and self.exc_type is None:
                self._note_group_exception(body)
            return TOOK
        if self.group and self.exc_type is not None:
            return self._take_after_exception(text, body, line_no)
        match = _EXCEPTION_LINE.fullmatch(body)
        if match is None:
            return self._foreign()
        self._keep(text)
        self.exc_type, self.message = match.group(1), match.group(2) or ""
        self.state = _AFTER_EXCEPTION
        return TOOK

    def _take_after_exception(self, text: str, body: str, line_no: int) -> str:
        if not body.strip():
            self.held_blanks.append((line_no, text))
            return TOOK
        if body.strip() in _CHAIN_MESSAGES:
            self._keep_held_blanks()
            self._keep(text)
            self.state = _CHAIN
            return TOOK
        if not self.held_blanks and body[:1] in (" ", "\t"):  # notes, indented continuation of the message
            self._keep(text)
            return TOOK
        return CLOSED

    def _take_chain(self, text: str, body: str) -> str:
        if not body.strip() or TRACEBACK_MARK in body:
            self._keep(text)
            if body.strip():
                self.state, self.exc_type, self.group = _BODY, None, "Exception Group" in body
            return TOOK
        return CLOSED

    def _note_group_exception(self, body: str) -> None:
        match = _GROUP_EXCEPTION_LINE.fullmatch(body)
        if match is not None:
            self.exc_type, self.message = match.group(1), match.group(2) or ""

    def _foreign(self) -> str:
        self.foreign_run += 1
        return CLOSED if self.foreign_run > MAX_FOREIGN_LINES else FOREIGN

    def _keep_held_blanks(self) -> None:
        for _, blank in self.held_blanks:
            self._keep(blank)
        self.held_blanks.clear()

    def _keep(self, text: str) -> None:
        self.foreign_run = 0
        self.n_lines += 1
        if len(self.head) < MAX_TRACEBACK_LINES // 2:
            self.head.append(text)
            return
        self.omitted += len(self.tail) == self.tail.maxlen
        self.tail.append(text)

    def event(self) -> ExceptionEvent:
        omitted = [f"... {self.omitted} lines omitted ..."] if self.omitted else []
        text = "\n".join(self.head + omitted + list(self.tail))
        return ExceptionEvent(self.line_no, text, self.exc_type, self.message, self.n_lines, True)

    @property
    def finished(self) -> bool:
        """Its last exception line has been read; only a chained block could still follow."""
        return self.state == _AFTER_EXCEPTION or (self.group and self.exc_type is not None)


# ---------------------------------------------------------------------------------------------- the stream

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n\r]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")


def _visible(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return _ANSI.sub("", text) if "\x1b" in text else text


def _last_segment(line: str) -> str:
    """What a terminal shows of a line redrawn with `\\r`: its last segment that shows anything (so `text\\r`,
    a CRLF end, or `text\\r` + colour codes, still shows `text`)."""
    for segment in reversed(line.split("\r")):
        if segment:
            return segment
    return ""


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
        self._traceback: _Traceback | None = None
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
        for segment in reversed(finished):  # only the last one that shows anything can matter
            text = _visible(segment[:self._cap])
            if text:
                self._shown = (text, len(segment) > self._cap)
                break
        self._segment, self._segment_truncated = bytearray(last[:self._cap]), len(last) > self._cap

    def _extend_segment(self, piece: bytes) -> None:
        room = self._cap - len(self._segment)
        self._segment += piece[:room]
        self._segment_truncated |= len(piece) > room

    def _finish_segment(self) -> None:
        text = _visible(bytes(self._segment))
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
        text = block.decode("utf-8", "replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        has_cr = "\r" in text
        step_line = _STEP_LINE.fullmatch
        line_no = self.line_count
        quiet = self._traceback is None and self._header is None  # no traceback or header being read
        for line in text.split("\n"):
            line_no += 1
            if has_cr and "\r" in line:
                line = _last_segment(line)
            # the fast path of _classify for the line that makes up nearly all of a training log
            if line[:1] == "[" and quiet:
                match = step_line(line)
                event = _step_from_match(match, line, line_no) if match is not None else None
                if event is not None:
                    out.append(event)
                    continue
            self.line_count = line_no
            self._take(line, False, out)
            quiet = self._traceback is None and self._header is None
        self.line_count = line_no

    def _emit_line_bytes(self, raw: bytes, out: list[Event]) -> None:
        text, truncated = "", False
        for segment in reversed(raw.split(b"\r")):
            shown = _visible(segment[:self._cap])
            if shown:
                text, truncated = shown, len(segment) > self._cap
                break
        self.line_count += 1
        self._take(text, truncated, out)

    # -- lines to events

    def _take(self, text: str, truncated: bool, out: list[Event]) -> None:
        line_no = self.line_count
        if self._traceback is None and self._header is None:
            self._classify(text, line_no, truncated, out)
        elif self._header is not None:
            self._take_after_header(text, line_no, truncated, out)
        else:
            self._take_in_traceback(text, line_no, truncated, out)

    def _classify(self, text: str, line_no: int, truncated: bool, out: list[Event]) -> None:
        if " step=" in text:
            step = parse_step_line(text, line_no)
            if step is not None:
                out.append(step)
                return
        mark = text.find(TRACEBACK_MARK)
        if mark >= 0:
            self._close_exception(out)  # one left open by interleaved output ends where another begins
            self._start_traceback(line_no, [text], _traceback_prefix(text[:mark]))
        elif "Exception" in text or "Error:" in text:
            if _TRACEBACK_HEADER.fullmatch(text):
                self._close_exception(out)
                self._header = (line_no, text)
            else:
                out.append(standalone_exception(text, line_no))
        else:
            out.append(parse_phase_line(text, line_no) or LogLine(line_no, text, truncated))

    def _start_traceback(self, line_no: int, lines: list[str], prefix: str) -> None:
        self._traceback = _Traceback(line_no, lines, prefix)

    def _take_after_header(self, text: str, line_no: int, truncated: bool, out: list[Event]) -> None:
        header_line_no, header = self._header  # type: ignore[misc]
        self._header = None
        mark = text.find(TRACEBACK_MARK)
        if mark >= 0:
            self._start_traceback(header_line_no, [header, text], _traceback_prefix(text[:mark]))
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


def _traceback_prefix(before_mark: str) -> str:
    # `[rank0]: Traceback ...` repeats its prefix on every line; an exception group's `  + Exception Group
    # Traceback ...` does not, its lines are merely indented.
    return "" if not before_mark or before_mark[0] in " \t" or "Exception Group" in before_mark else before_mark


def parse_lines(lines: Iterable[str]) -> list[Event]:
    """Events of a finished log given as lines (without their newlines)."""
    parser = LogParser()
    events = [event for line in lines for event in parser.feed((line + "\n").encode("utf-8", "replace"))]
    return events + parser.flush()
