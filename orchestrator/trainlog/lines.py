"""Single lines of a trainer's output, and metrics.jsonl records, turned into the events they stand for.

Every parser here takes one whole line and returns an event or None; none of them raises on garbage. The event
types live here too, as the one module the traceback reader and the stream parser both build on.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dflash_records.protocol import ascii_decimal
from dflash_records.step import (
    StepRecord,
    parse_duration,
    read_step_json,
    read_step_line,
    record_from_match,
    tok_per_s,
)



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
    stage: str | None = None  # startup: loading target, building drafter, compiling k/n (...), first step
    elapsed_s: float | None = None  # startup: seconds since the trainer started


PHASES = ("loading_dataset", "dataset_loaded", "batches_per_epoch", "bucket", "loading_targets",
          "target_loading", "startup", "compiling", "training", "finished")


@dataclass(frozen=True)
class StepEvent(StepRecord):
    """A step record as read from the log (its line) or from metrics.jsonl (line_no None). `partial` says some
    field was missing, as in a line cut off mid-way."""

    line_no: int | None = None
    text: str = ""
    total: int | None = None  # a `generate` progress line: the prompts in all; `step` is the answered count


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

# ---------------------------------------------------------------------------------------------- step lines


def parse_step_line(text: str, line_no: int | None = None) -> StepEvent | None:
    """A step line in the trainer's format, or what a cut-off one still holds (partial); None if not one."""
    return read_step_line(text, StepEvent, line_no=line_no, text=text)


def step_from_match(match: re.Match[str], text: str, line_no: int | None) -> StepEvent | None:
    return record_from_match(match, StepEvent, line_no=line_no, text=text)


# ---------------------------------------------------------------------------------------------- generate lines

GENERATE_LINE = re.compile(r"\[([^\]]*)\] generate answered=(\d+)/(\d+) failed=(\d+) \| "
                           r"([\d.]+)([KMG]?)tok/s (\S+)prompts/s \| ETA=(\S+)")


def parse_generate_line(text: str, line_no: int | None = None) -> StepEvent | None:
    """`generate`'s progress line (trainer/logformat.py) read like a step line: the answered count is the step,
    with tok/s, ETA and the total; the training metrics are absent (partial). None if not one."""
    match = GENERATE_LINE.fullmatch(text.rstrip())
    if match is None:
        return None
    elapsed, answered, total, _failed, tokens, scale, _prompts, eta = match.groups()
    return StepEvent(line_no=line_no, text=text, partial=True, elapsed_s=parse_duration(elapsed),
                     step=int(answered), tok_per_s=tok_per_s(tokens, scale), eta_s=parse_duration(eta),
                     total=int(total))


# ---------------------------------------------------------------------------------------------- step times

_STEP_TIMES = re.compile(r"\s*step times: (.*)")
_STEP_TIME = re.compile(r"(data|target|drafter|optimizer|comm|wall) (\d+(?:\.\d*)?)s")


def parse_step_times_line(text: str) -> dict[str, float] | None:
    """The bundled trainer's `step times: data 0.003s, target 0.180s, ..., wall 0.420s` line (seconds per step
    in each phase, trainer/logformat.py) -> {phase: seconds}; None if not one, or one without its wall time."""
    match = _STEP_TIMES.fullmatch(text.rstrip())
    if match is None:
        return None
    times = {name: float(value) for name, value in _STEP_TIME.findall(match.group(1))}
    return times if "wall" in times else None


# ---------------------------------------------------------------------------------------------- metrics.jsonl


def parse_metrics_jsonl_line(line: str | bytes) -> StepEvent | None:
    """One line of metrics.jsonl -> a StepEvent, or None when it is not a step record (or not JSON at all)."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return read_step_json(line, StepEvent, text=text.rstrip("\r\n"))


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
    ("startup", re.compile(r"Start-up \[(?P<elapsed_s>\d+(?:\.\d*)?)s\]: (?P<stage>\S.*)")),
    ("compiling", re.compile(r"Compiling kernels\b.*")),
    ("training", re.compile(r"(?:Starting training|Training started|Training\.\.\.)\b.*")),
    ("finished", re.compile(r"(?:Training (?:finished|complete|completed|done)\b|Finished training\b|Finished:).*")),
)
_PHASE_STARTS = ("Loading", "Batches", "Bucket", "Target", "Compiling", "Start", "Train", "Finish")
_FLOAT_FIELDS = ("batch_avg", "pct", "elapsed_s")
_TEXT_FIELDS = ("path", "device", "stage")


def parse_phase_line(text: str, line_no: int | None = None) -> PhaseEvent | None:
    stripped = text.lstrip()
    if not stripped.startswith(_PHASE_STARTS) and ascii_decimal(stripped[:1]) is None:
        return None
    for phase, pattern in _PHASE_LINES:
        match = pattern.fullmatch(text.rstrip())
        if match is not None:
            try:
                values = {key: (float(v) if key in _FLOAT_FIELDS else v if key in _TEXT_FIELDS else int(v))
                          for key, v in match.groupdict().items() if v is not None}
            except ValueError:  # `avg=1.2.3`: the shape of a start-up line, not its content
                return None
            return PhaseEvent(line_no, text, phase, **values)
    return None

