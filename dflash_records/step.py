"""The step record: what a training run reports for one logged step, with its two encodings side by side.

- its human line, in the seed trainer's format (shared fixtures), e.g. `[6m] step=8 loss=12.5546 acc=0.025
  streak=0.0 lr=4.52e-06 noise=0.0003 | tgt=0.34b/s dft=0.29b/s (11.7Ktok/s) | q_pre=[50, 50] q_hs=[15] |
  epoch~0.01 ETA=12.0d` (on one line), then, an addition to the seed format, the τ figures measured at this
  step: ` | tau_replay=1.840 tau_heldout=1.790 tau_eval=1.810 tau_tree_heldout=8:2.410,32:2.930`;
- its line of metrics.jsonl: the same fields as one JSON object with `"event": "step"` and the schema version,
  exact where the human line rounds (`(0.3Ktok/s)` for 350 tok/s). NaN is written as null, infinities as
  "inf"/"-inf" (strict JSON).

The trainer writes both; the agent and the controller read them with the readers here. A reader never raises:
a line cut off mid-way gives what it still holds (`partial`), anything else gives None. Readers take the class
to build (a subclass that adds where the record was read, e.g. the controller's StepEvent) and its extra fields.

Time formats (chosen so a reader sees the right unit at a glance, and a parser needs no lookahead):
- elapsed, in brackets: under a minute `[42s]`, under five minutes `[1m05s]`, under an hour whole minutes `[6m]`
  (floored, as the seed trainer printed them), from an hour on `[3h07m]`.
- ETA: one decimal in the largest unit that keeps the number at least 1: seconds under a minute (`45.0s`),
  minutes under an hour (`12.5m`), hours under a day (`5.2h`), days from then on (`12.0d`); `?` when unknown.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from functools import lru_cache

METRICS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class StepRecord:
    """One logged step. The writer sets every field but the τ ones, which are there only where measured; a
    reader leaves what a record does not hold None. Queue depths and tree τ are tuples (lists and a
    {budget: τ} dict are taken and converted)."""

    elapsed_s: float | None = None
    step: int | None = None
    loss: float | None = None
    acc: float | None = None
    streak: float | None = None
    lr: float | None = None
    noise: float | None = None
    tgt_batches_per_s: float | None = None  # target forward batches per second
    dft_batches_per_s: float | None = None  # drafter steps per second
    tok_per_s: float | None = None
    q_pre: tuple[int, ...] | None = None    # depth of each prefetch queue
    q_hs: tuple[int, ...] | None = None     # depth of each hidden-state queue
    epoch: float | None = None
    eta_s: float | None = None
    # τ predicted from replayed decoding rounds (trainer/training/tau_replay.py), present only where measured: on the
    # step's own batch, on the held-out split (eval_every), and from real speculative decoding of held-out prompts
    tau_replay: float | None = None
    tau_heldout: float | None = None
    tau_eval: float | None = None
    # DDTree rounds replayed on the held-out split: (node budget, τ) pairs, smallest budget first
    tau_tree_heldout: tuple[tuple[int, float], ...] | None = None
    partial: bool = False  # read from a line cut off mid-way: a field the writer always writes is missing

    def __post_init__(self) -> None:
        for name in ("q_pre", "q_hs"):
            depths = getattr(self, name)
            if depths is not None and not isinstance(depths, tuple):
                object.__setattr__(self, name, tuple(int(depth) for depth in depths))
        tree = self.tau_tree_heldout
        if isinstance(tree, dict):
            pairs = tuple(sorted((int(budget), float(tau)) for budget, tau in tree.items()))
            object.__setattr__(self, "tau_tree_heldout", pairs or None)

    def to_line(self) -> str:
        """The human step line (the writer's: every field but the τ ones must be set)."""
        return format_step_line(self)

    def to_json(self, **extra) -> str:
        """The record's line of metrics.jsonl (without its newline), with `extra` keys after the record's own."""
        return step_json(self, **extra)

    @classmethod
    def from_line(cls, line: str, **context):
        return read_step_line(line, cls, **context)

    @classmethod
    def from_json(cls, line, **context):
        return read_step_json(line, cls, **context)


# optional: a record without them is whole
TAU_FIELDS = ("tau_replay", "tau_heldout", "tau_eval", "tau_tree_heldout")
RECORD_FIELDS = tuple(f.name for f in fields(StepRecord) if f.name != "partial")
# what the writer always writes (eta_s may be unknown: `ETA=?`, null)
STEP_FIELDS = tuple(name for name in RECORD_FIELDS if name not in TAU_FIELDS)
QUEUE_FIELDS = ("q_pre", "q_hs")

# The start of a step line: the elapsed time in brackets, then the step number. The agent's hang watchdog needs
# only to know that a step went by, and which.
STEP_MARK = re.compile(r"\[(\d[\d.dhms]*)\] step=(\d+)")

# ---------------------------------------------------------------------------------------------- times


def format_elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return "{}s".format(seconds)
    if seconds < 300:
        # the seed format's whole minutes hide most of the first minutes (`[1m]` from 60 to 119 s)
        return "{}m{:02d}s".format(seconds // 60, seconds % 60)
    if seconds < 3600:
        return "{}m".format(seconds // 60)
    return "{}h{:02d}m".format(seconds // 3600, seconds % 3600 // 60)


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    for unit, size, limit in (("s", 1, 60), ("m", 60, 3600), ("h", 3600, 86400)):
        if seconds < limit:
            return "{:.1f}{}".format(seconds / size, unit)
    return "{:.1f}d".format(seconds / 86400)


_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)d)?(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s)?")


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


# ---------------------------------------------------------------------------------------------- the human line


def format_step_line(record: StepRecord) -> str:
    return _format_seed_step(record) + format_tau_suffix(record)


def format_tau_suffix(record: StepRecord) -> str:
    """` | tau_replay=1.840 ...` with the τ fields that were measured, or nothing."""
    shown = ["{}={}".format(name, _format_tau(getattr(record, name)))
             for name in TAU_FIELDS if getattr(record, name) is not None]
    return " | " + " ".join(shown) if shown else ""


def _format_tau(value) -> str:
    # three decimals always: a reader tells a whole value from one cut short by the log's end
    if isinstance(value, tuple):
        return ",".join("{}:{:.3f}".format(int(budget), tau) for budget, tau in value)
    return "{:.3f}".format(value)


def _format_queue(depths) -> str:
    return "[" + ", ".join(str(int(d)) for d in depths) + "]"


def _format_seed_step(r: StepRecord) -> str:
    return (
        "[{}] step={} loss={:.4f} acc={:.3f} streak={:.1f} lr={:.2e} noise={:g} | "
        "tgt={:.2f}b/s dft={:.2f}b/s ({:.1f}Ktok/s) | q_pre={} q_hs={} | epoch~{:.2f} ETA={}"
    ).format(format_elapsed(r.elapsed_s), r.step, r.loss, r.acc, r.streak, r.lr, r.noise, r.tgt_batches_per_s,
             r.dft_batches_per_s, r.tok_per_s / 1000, _format_queue(r.q_pre or ()), _format_queue(r.q_hs or ()),
             r.epoch, format_eta(r.eta_s))


STEP_LINE = re.compile(
    r"\[([^\]]*)\] step=(\d+) loss=(\S+) acc=(\S+) streak=(\S+) lr=(\S+) noise=(\S+) \| "
    r"tgt=(\S+)b/s dft=(\S+)b/s \((\S+?)([KMG]?)tok/s\) \| q_pre=\[([^\]]*)\] q_hs=\[([^\]]*)\] \| "
    r"epoch~(\S+) ETA=(\S+)(?: \| ((?:tau_\w+=(?:\d+:)?\d+\.\d{3}(?:,\d+:\d+\.\d{3})* ?)+))?"
)
TOK_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}
# τ values are written with three decimals: a value cut short fails the whole-line pattern, and the tolerant
# reader then leaves the value the line ends on out
_TAU_PAIR = re.compile(r"(tau_replay|tau_heldout|tau_eval|tau_tree_heldout)=(\S+)")
_STEP_KEYS = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|epoch|ETA|tau_replay|tau_heldout|tau_eval|"
                        r"tau_tree_heldout)"
                        r"[=~]([^\s|()\[\]]+)")
_STEP_QUEUES = re.compile(r"\b(q_pre|q_hs)=\[([\d,\s]*)\]")
_STEP_TOKENS = re.compile(r"\(([\d.]+(?:[eE][-+]?\d+)?)([KMG]?)tok/s\)")
_new_object = object.__new__
_set_attribute = object.__setattr__


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


def _rate(text: str) -> float | None:
    return _float(text[:-3] if text.endswith("b/s") else text)


def _tree_taus(text: str) -> tuple[tuple[int, float], ...] | None:
    """`8:2.410,32:2.930` -> ((8, 2.41), (32, 2.93)); None when any pair is not whole."""
    try:
        pairs = tuple((int(budget), float(tau)) for budget, tau in (pair.split(":") for pair in text.split(",")))
    except ValueError:
        return None
    return tuple(sorted(pairs)) or None


@lru_cache(maxsize=4096)
def _queue_depths(text: str) -> tuple[int, ...]:
    # queues sit at the same depths for long stretches (full, or empty): the same few strings recur
    return tuple(map(int, text.split(","))) if text else ()


def _depths(text: str) -> tuple[int, ...] | None:
    try:
        return _queue_depths(text.strip())
    except ValueError:
        return None


def tok_per_s(number: str, scale: str) -> float | None:
    """`11.7`, `K` (as in `(11.7Ktok/s)`) -> 11700.0; None when the number is not one."""
    value = _float(number)
    return None if value is None else value * TOK_SCALE[scale]


_STEP_CONVERT = {"step": _int, "loss": _float, "acc": _float, "streak": _float, "lr": _float, "noise": _float,
                 "epoch": _float, "ETA": parse_duration, "tau_replay": _float, "tau_heldout": _float,
                 "tau_eval": _float, "tau_tree_heldout": _tree_taus, "tgt": _rate, "dft": _rate}
_TAU_VALUE = {"tau_replay": float, "tau_heldout": float, "tau_eval": float, "tau_tree_heldout": _tree_taus}
_STEP_NAMES = {"tgt": "tgt_batches_per_s", "dft": "dft_batches_per_s", "ETA": "eta_s"}


def read_step_line(line: str, cls=StepRecord, **context):
    """A step line as `cls(..., **context)`, or what a cut-off one still holds (partial); None if not one."""
    match = STEP_LINE.fullmatch(line)
    if match is not None:
        record = record_from_match(match, cls, **context)
        if record is not None:
            return record
    if "loss=" not in line and STEP_MARK.search(line) is None:
        return None  # `saved checkpoint step=100` mentions a step, it is not a step line
    return _record_from_fields(line, cls, context)


def record_from_match(match, cls=StepRecord, **context):
    """The record a whole STEP_LINE match holds; None when the shape matched but a value did not (the tolerant
    reader then takes what is good)."""
    (elapsed, step, loss, acc, streak, lr, noise, tgt, dft, tokens, scale, q_pre, q_hs, epoch, eta,
     taus) = match.groups()
    try:
        values = {
            "elapsed_s": parse_duration(elapsed), "step": int(step), "loss": float(loss), "acc": float(acc),
            "streak": float(streak), "lr": float(lr), "noise": float(noise), "tgt_batches_per_s": float(tgt),
            "dft_batches_per_s": float(dft), "tok_per_s": float(tokens) * TOK_SCALE[scale],
            "q_pre": _queue_depths(q_pre), "q_hs": _queue_depths(q_hs), "epoch": float(epoch),
            "eta_s": parse_duration(eta), "partial": False,
        }
        if taus:
            values.update((name, _TAU_VALUE[name](value)) for name, value in _TAU_PAIR.findall(taus))
    except ValueError:
        return None
    values.update(context)
    # The generated __init__ of a frozen dataclass sets each field through object.__setattr__, which is a
    # quarter of the time a step line costs; filling __dict__ at once gives the same object (the fields left out
    # read their class defaults).
    record = _new_object(cls)
    _set_attribute(record, "__dict__", values)
    return record


def _record_from_fields(line: str, cls, context: dict):
    values = {}
    for match in _STEP_KEYS.finditer(line):
        key, value = match.groups()
        # a value the line ends on may have been cut mid-number; ETA alone legitimately ends a line
        if match.end() == len(line) and key != "ETA":
            continue
        values[_STEP_NAMES.get(key, key)] = _STEP_CONVERT[key](value)
    if values.get("step") is None:
        return None
    for match in _STEP_QUEUES.finditer(line):
        values[match.group(1)] = _depths(match.group(2))
    tokens = _STEP_TOKENS.search(line)
    if tokens is not None:
        values["tok_per_s"] = tok_per_s(*tokens.groups())
    elapsed = STEP_MARK.search(line)
    if elapsed is not None:
        values["elapsed_s"] = parse_duration(elapsed.group(1))
    partial = any(values.get(name) is None for name in STEP_FIELDS if name != "eta_s") or "eta_s" not in values
    values.update(context)
    return cls(partial=partial, **values)


# ---------------------------------------------------------------------------------------------- metrics.jsonl


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def step_json(record: StepRecord, **extra) -> str:
    """One line of metrics.jsonl: `"event": "step"`, the schema version, the record's fields (the τ ones only
    where measured), then `extra`."""
    line = {"event": "step", "v": METRICS_SCHEMA_VERSION}
    for name in RECORD_FIELDS:
        value = getattr(record, name)
        if name in TAU_FIELDS and value is None:
            continue
        if name == "tau_tree_heldout":
            value = {str(budget): tau for budget, tau in value}
        elif name in QUEUE_FIELDS and value is not None:
            value = list(value)
        line[name] = _finite_or_none(value)
    line.update(extra)
    return json.dumps(line, separators=(", ", ": "))


def read_step_json(line, cls=StepRecord, **context):
    """One line of metrics.jsonl (str or bytes) as `cls(..., **context)`, or None when it is not a step record
    (or not JSON at all). A null metric reads as NaN (the writer's NaN); a value of the wrong type as None."""
    try:
        fields_in = json.loads(line)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(fields_in, dict) or fields_in.get("event", "step") != "step" or "step" not in fields_in:
        return None
    values = {name: _json_value(name, fields_in[name]) for name in RECORD_FIELDS if name in fields_in}
    partial = any(values.get(name) is None for name in STEP_FIELDS if name != "eta_s")
    values.update(context)
    return cls(partial=partial, **values)


def _json_tree_taus(value) -> tuple[tuple[int, float], ...] | None:
    """metrics.jsonl's `{"8": 2.41, "32": 2.93}` -> ((8, 2.41), (32, 2.93)); None when it is anything else."""
    if not isinstance(value, dict):
        return None
    try:
        pairs = tuple(sorted((int(budget), float(tau)) for budget, tau in value.items()
                             if not isinstance(tau, bool)))
    except (ValueError, TypeError, OverflowError):
        return None
    return pairs or None


def _json_value(name: str, value):
    if name == "tau_tree_heldout":
        return _json_tree_taus(value)
    if name in QUEUE_FIELDS:
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
