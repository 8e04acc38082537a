"""Single lines of a trainer's output, and metrics.jsonl records, turned into the events they stand for.

Every parser here takes one whole line and returns an event or None; none of them raises on garbage. The event
types live here too, as the one module the traceback reader and the stream parser both build on.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache

from ..agent.protocol import ascii_decimal
from ..agent.terminaltext import STEP_MARK


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
    total: int | None = None  # a `generate` progress line: the prompts in all; `step` is the answered count
    tau_replay: float | None = None   # τ from replayed decoding rounds on the step's batch (only where measured)
    tau_heldout: float | None = None  # the same on the held-out split (eval_every steps)
    tau_eval: float | None = None     # real speculative decoding of held-out prompts
    # DDTree rounds replayed on the held-out split: (node budget, τ) pairs, smallest budget first
    tau_tree_heldout: tuple[tuple[int, float], ...] | None = None


_new_object = object.__new__
_set_attribute = object.__setattr__
STEP_FIELDS = ("elapsed_s", "step", "loss", "acc", "streak", "lr", "noise", "tgt_bps", "dft_bps",
               "tok_per_s", "q_pre", "q_hs", "epoch", "eta_s")
# optional: a step line without them is whole
TAU_FIELDS = ("tau_replay", "tau_heldout", "tau_eval", "tau_tree_heldout")


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


def _tree_taus(text: str) -> tuple[tuple[int, float], ...] | None:
    """`8:2.410,32:2.930` -> ((8, 2.41), (32, 2.93)); None when any pair is not whole."""
    try:
        pairs = tuple((int(budget), float(tau)) for budget, tau in (pair.split(":") for pair in text.split(",")))
    except ValueError:
        return None
    return tuple(sorted(pairs)) or None


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

STEP_LINE = re.compile(
    r"\[([^\]]*)\] step=(\d+) loss=(\S+) acc=(\S+) streak=(\S+) lr=(\S+) noise=(\S+) \| "
    r"tgt=(\S+)b/s dft=(\S+)b/s \((\S+?)([KMG]?)tok/s\) \| q_pre=\[([^\]]*)\] q_hs=\[([^\]]*)\] \| "
    r"epoch~(\S+) ETA=(\S+)(?: \| ((?:tau_\w+=(?:\d+:)?\d+\.\d{3}(?:,\d+:\d+\.\d{3})* ?)+))?"
)
# τ values are written with three decimals: a value cut short fails the whole-line pattern, and the tolerant
# reader then leaves the value the line ends on out
_TAU_PAIR = re.compile(r"(tau_replay|tau_heldout|tau_eval|tau_tree_heldout)=(\S+)")
_STEP_KEYS = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|epoch|ETA|tau_replay|tau_heldout|tau_eval|"
                        r"tau_tree_heldout)"
                        r"[=~]([^\s|()\[\]]+)")
_STEP_QUEUES = re.compile(r"\b(q_pre|q_hs)=\[([\d,\s]*)\]")
_STEP_TOKENS = re.compile(r"\(([\d.]+(?:[eE][-+]?\d+)?)([KMG]?)tok/s\)")
_STEP_ELAPSED = STEP_MARK  # the agent's watchdog knows a step line by the same mark
_STEP_CONVERT = {"step": _int, "loss": _float, "acc": _float, "streak": _float, "lr": _float, "noise": _float,
                 "epoch": _float, "ETA": parse_duration, "tau_replay": _float, "tau_heldout": _float,
                 "tau_eval": _float, "tau_tree_heldout": _tree_taus,
                 "tgt": lambda v: _float(v.removesuffix("b/s")), "dft": lambda v: _float(v.removesuffix("b/s"))}
_TAU_VALUE = {"tau_replay": float, "tau_heldout": float, "tau_eval": float, "tau_tree_heldout": _tree_taus}
_STEP_NAMES = {"tgt": "tgt_bps", "dft": "dft_bps", "ETA": "eta_s"}


def parse_step_line(text: str, line_no: int | None = None) -> StepEvent | None:
    """A step line in the trainer's format, or what a cut-off one still holds (partial); None if not one."""
    match = STEP_LINE.fullmatch(text)
    if match is not None:
        event = step_from_match(match, text, line_no)
        if event is not None:
            return event
    if "loss=" not in text and _STEP_ELAPSED.search(text) is None:
        return None  # `saved checkpoint step=100` mentions a step, it is not a step line
    return _step_from_fields(text, line_no)


def step_from_match(match: re.Match[str], text: str, line_no: int | None) -> StepEvent | None:
    (elapsed, step, loss, acc, streak, lr, noise, tgt, dft, tokens, scale, q_pre, q_hs, epoch, eta,
     taus) = match.groups()
    try:
        fields = {
            "line_no": line_no, "text": text, "partial": False, "elapsed_s": parse_duration(elapsed),
            "step": int(step), "loss": float(loss), "acc": float(acc), "streak": float(streak), "lr": float(lr),
            "noise": float(noise), "tgt_bps": float(tgt), "dft_bps": float(dft),
            "tok_per_s": float(tokens) * _TOK_SCALE[scale],
            "q_pre": _queue_depths(q_pre), "q_hs": _queue_depths(q_hs),
            "epoch": float(epoch), "eta_s": parse_duration(eta),
        }
        if taus:
            fields.update((name, _TAU_VALUE[name](value)) for name, value in _TAU_PAIR.findall(taus))
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
    return StepEvent(line_no, text, True, elapsed_s=parse_duration(elapsed), step=int(answered),
                     tok_per_s=_tok_per_s(tokens, scale), eta_s=parse_duration(eta), total=int(total))


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
    values = {name: _json_value(name, fields[name]) for name in STEP_FIELDS + TAU_FIELDS if name in fields}
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


def _json_tree_taus(value: object) -> tuple[tuple[int, float], ...] | None:
    """metrics.jsonl's `{"8": 2.41, "32": 2.93}` -> ((8, 2.41), (32, 2.93)); None when it is anything else."""
    if not isinstance(value, dict):
        return None
    try:
        pairs = tuple(sorted((int(budget), float(tau)) for budget, tau in value.items()
                             if not isinstance(tau, bool)))
    except (ValueError, TypeError, OverflowError):
        return None
    return pairs or None


def _json_value(name: str, value: object) -> object:
    if name == "tau_tree_heldout":
        return _json_tree_taus(value)
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

