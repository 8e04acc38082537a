"""The log parser against the seed's real lines, the trainer's writer, real Python tracebacks, and fuzzing."""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.trainlog.parser import (
    MAX_LINE_BYTES,
    ExceptionEvent,
    LogLine,
    LogParser,
    PhaseEvent,
    StepEvent,
    parse_duration,
    parse_lines,
    parse_metrics_jsonl_line,
    parse_step_line,
)
from dflash_records.step import TAU_FIELDS, StepRecord, format_step_line, step_json
from trainer import logformat

from tests.seed_logs import SEED_STARTUP, SEED_STEPS
from tests.seed_logs import SHARED as SHARED_LOGS


@pytest.mark.skipif(not SHARED_LOGS.is_dir(), reason="shared/fixtures not beside the checkout")
def test_repo_copies_of_the_seed_lines_match_the_shared_fixtures():
    assert (SHARED_LOGS / "seed_startup.log").read_text() == SEED_STARTUP
    assert (SHARED_LOGS / "seed_steps.log").read_text() == SEED_STEPS


def parse_all(data: bytes, *, chunk: int | None = None, parser: LogParser | None = None) -> list:
    parser = parser or LogParser()
    if chunk is None:
        return parser.feed(data) + parser.flush()
    events = []
    for offset in range(0, len(data), chunk):
        events += parser.feed(data[offset:offset + chunk])
    return events + parser.flush()


def python_stderr(code: str) -> bytes:
    """What a real Python process prints on stderr when it runs `code` (tracebacks in the real format)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).stderr


# ------------------------------------------------------------------------------------------ seed fixtures


def test_seed_startup_lines_become_phase_events():
    events = parse_all(SEED_STARTUP.encode())
    phases = [e for e in events if isinstance(e, PhaseEvent)]
    assert [e.phase for e in phases] == (["loading_dataset", "dataset_loaded", "batches_per_epoch"]
                                        + ["bucket"] * 6 + ["loading_targets", "target_loading"])
    assert phases[0].path == "/workspace/tokenized_completions"
    assert phases[1].n_samples == 1095082
    assert (phases[2].n_batches, phases[2].batch_min, phases[2].batch_max, phases[2].batch_avg) == (59822, 6, 64, 18.3)
    buckets = phases[3:9]
    assert [(b.index, b.lo, b.hi) for b in buckets][:2] == [(0, 0, 770), (1, 770, 1216)]
    assert buckets[-1].n_batches == 27878 and buckets[-1].pct == 46.6
    assert sum(b.n_batches for b in buckets) == phases[2].n_batches
    assert phases[-2].n_targets == 5
    assert (phases[-1].index, phases[-1].device) == (0, "cuda:0")
    assert [e.line_no for e in events] == list(range(1, len(events) + 1))
    assert [type(e) for e in events].count(LogLine) == 1  # the blank line after the bucket table


def test_seed_step_lines_and_the_cut_off_one():
    first, second, cut = parse_all(SEED_STEPS.encode())
    assert isinstance(first, StepEvent) and not first.partial
    assert (first.elapsed_s, first.step, first.loss, first.acc, first.streak) == (360.0, 8, 12.5546, 0.025, 0.0)
    assert (first.lr, first.noise, first.tgt_batches_per_s, first.dft_batches_per_s) == (4.52e-06, 0.0003, 0.34, 0.29)
    assert first.tok_per_s == pytest.approx(11700.0)
    assert first.q_pre == (50, 50, 50, 49, 50) and first.q_hs == (15,)
    assert first.epoch == 0.01 and first.eta_s == pytest.approx(12.0 * 86400)
    assert second.loss == 13.0073 and second.eta_s == pytest.approx(11.9 * 86400)
    assert cut.partial and cut.loss == 12.9459 and cut.q_hs == (18,)
    assert cut.epoch is None and cut.eta_s is None


def test_a_notifiers_json_alerts_are_not_its_own_steps_or_exceptions():
    """`watch --headless` prints one JSON object per alert, quoting the run's last step line and its error: a
    notifier launched as a run must not look like a training run (nor alert about its own alerts)."""
    step_line = SEED_STEPS.splitlines()[0]
    alerts = [{"version": 1, "type": "alert", "kind": "stall", "run_id": "train-1", "message": "no step for 600 s",
               "last_step_line": step_line},
              {"version": 1, "type": "alert", "kind": "exception", "run_id": "train-1",
               "message": "ValueError: boom", "last_step_line": step_line}]
    events = parse_all("".join(json.dumps(alert) + "\n" for alert in alerts).encode())
    assert [type(event) for event in events] == [LogLine, LogLine]


@pytest.mark.parametrize("text, seconds", [
    ("45s", 45.0), ("6m", 360.0), ("1h23m", 4980.0), ("3h07m", 11220.0), ("12.0d", 12 * 86400.0),
    ("3.5h", 12600.0), ("20m", 1200.0), ("45.0s", 45.0), ("?", None), ("", None), ("12", None), ("m", None),
])
def test_durations(text, seconds):
    assert parse_duration(text) == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize("tokens, expected", [("11.7K", 11700.0), ("950", 950.0), ("1.25M", 1.25e6)])
def test_token_throughput_units(tokens, expected):
    line = (f"[45s] step=1 loss=1.0 acc=0.5 streak=1.0 lr=1.00e-04 noise=0 | tgt=1.00b/s dft=1.00b/s "
            f"({tokens}tok/s) | q_pre=[] q_hs=[0] | epoch~0.00 ETA=?")
    event = parse_step_line(line)
    assert event.tok_per_s == pytest.approx(expected) and event.q_pre == () and event.eta_s is None


def test_fast_and_tolerant_readers_agree():
    line = SEED_STEPS.splitlines()[0]
    fast = parse_step_line(line, 7)
    tolerant = parse_step_line("[rank0]: " + line, 7)  # a prefix sends it down the tolerant path
    assert dataclasses.asdict(fast) | {"text": None} == dataclasses.asdict(tolerant) | {"text": None}
    assert dataclasses.replace(fast) == fast and hash(fast) == hash(dataclasses.replace(fast))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.loss = 1.0  # type: ignore[misc]


def test_a_line_that_mentions_a_step_is_not_a_step_line():
    (event,) = parse_all(b"saved checkpoint step=100 to /out\n")
    assert isinstance(event, LogLine)


def test_nan_and_inf_loss_are_read():
    line = ("[1m] step=3 loss=nan acc=0.000 streak=0.0 lr=1.00e-04 noise=0 | tgt=1.00b/s dft=1.00b/s "
            "(1.0Ktok/s) | q_pre=[1] q_hs=[1] | epoch~0.00 ETA=5.0m")
    assert math.isnan(parse_step_line(line).loss)
    assert parse_step_line(line.replace("loss=nan", "loss=inf")).loss == math.inf


# ------------------------------------------------------------------------------------------ the trainer's writer

finite = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
depths = st.lists(st.integers(min_value=0, max_value=10_000), max_size=8)
step_metrics = st.builds(
    StepRecord,
    elapsed_s=st.floats(min_value=0, max_value=3e7), step=st.integers(min_value=0, max_value=10**9),
    loss=st.one_of(finite, st.just(math.nan), st.just(math.inf)), acc=st.floats(min_value=0, max_value=1),
    streak=st.floats(min_value=0, max_value=16), lr=st.floats(min_value=1e-9, max_value=1.0),
    noise=st.floats(min_value=0, max_value=1), tgt_batches_per_s=finite, dft_batches_per_s=finite,
    tok_per_s=st.floats(min_value=0, max_value=1e8), q_pre=depths, q_hs=depths,
    epoch=st.floats(min_value=0, max_value=100), eta_s=st.one_of(st.none(), st.floats(min_value=0, max_value=1e9)),
    tau_replay=st.one_of(st.none(), st.floats(min_value=1, max_value=16)),
    tau_heldout=st.one_of(st.none(), st.floats(min_value=1, max_value=16)),
    tau_eval=st.one_of(st.none(), st.floats(min_value=1, max_value=16)),
    tau_tree_heldout=st.one_of(st.none(), st.dictionaries(st.integers(min_value=1, max_value=1024),
                                                          st.floats(min_value=1, max_value=16), min_size=1)),
)


def same_number(parsed: float, written: float, *, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    if math.isnan(written):
        return math.isnan(parsed)
    return math.isclose(parsed, written, abs_tol=abs_tol, rel_tol=rel_tol)


@settings(max_examples=300, deadline=None)
@given(step_metrics)
def test_writer_step_line_round_trip(metrics):
    event = parse_step_line(format_step_line(metrics))
    assert event is not None and not event.partial
    assert event.step == metrics.step and event.q_pre == tuple(metrics.q_pre) and event.q_hs == tuple(metrics.q_hs)
    assert same_number(event.loss, metrics.loss, abs_tol=5.1e-5)
    assert same_number(event.acc, metrics.acc, abs_tol=5.1e-4)
    assert same_number(event.streak, metrics.streak, abs_tol=0.051)
    assert same_number(event.lr, metrics.lr, rel_tol=0.01)
    assert same_number(event.noise, metrics.noise, rel_tol=1e-5, abs_tol=1e-300)
    assert same_number(event.tgt_batches_per_s, metrics.tgt_batches_per_s, abs_tol=0.0051)
    assert same_number(event.tok_per_s, metrics.tok_per_s, abs_tol=51)
    assert same_number(event.epoch, metrics.epoch, abs_tol=0.0051)
    # elapsed is floored to the unit shown; the ETA keeps one decimal of its unit
    assert event.elapsed_s <= metrics.elapsed_s < event.elapsed_s + (1 if metrics.elapsed_s < 60 else 60)
    if metrics.eta_s is None:
        assert event.eta_s is None
    else:
        assert same_number(event.eta_s, metrics.eta_s, rel_tol=0.05, abs_tol=0.05)
    for name in TAU_FIELDS:  # written with three decimals, only where measured
        written, parsed = getattr(metrics, name), getattr(event, name)
        if written is None:
            assert parsed is None, name
        elif name == "tau_tree_heldout":  # tree τ per node budget: (budget, τ) pairs, smallest budget first
            assert [budget for budget, _ in parsed] == [budget for budget, _ in written], name
            assert all(same_number(tau, dict(written)[budget], abs_tol=5.1e-4) for budget, tau in parsed), name
        else:
            assert same_number(parsed, written, abs_tol=5.1e-4), name


@settings(max_examples=300, deadline=None)
@given(step_metrics)
def test_writer_metrics_json_round_trip(metrics):
    event = parse_metrics_jsonl_line(step_json(metrics) + "\n")
    assert event is not None and not event.partial and event.line_no is None
    written = dataclasses.asdict(metrics)  # the same fields, exact: lists and the tree's dict as tuples
    for name, value in written.items():
        parsed = getattr(event, name)
        assert parsed == value or (isinstance(value, float) and math.isnan(value) and math.isnan(parsed)), name


def test_writer_start_up_lines_round_trip():
    text = "\n".join([
        logformat.format_dataset_lines("/data/set with spaces", 1234),
        logformat.format_overlong_line(3, 4096, action="dropped"),
        logformat.format_batches_line(99, min_size=2, max_size=40, avg_size=7.25),
        logformat.format_bucket_table([0, 16, 4096, 10000], [10, 80, 9]),
        logformat.format_loading_targets(1),
        logformat.format_target_on(0, "cpu"),
        logformat.format_startup_line(41.25, "compiling 1/2 (flex_attention, full_attention layers)"),
        "Compiling kernels as new batch shapes come",  # what trainers before the start-up lines wrote
        logformat.format_compiled_line(1, graphs=2, total=2, seconds=212.44, batch=16, seq_len=1023, blocks=1024),
        "Finished: 12 steps in 3.4s; checkpoint /out/step_12",
    ]) + "\n"
    events = parse_all(text.encode())
    assert events[2] == LogLine(3, "  3 samples longer than max_length=4096 (dropped)")
    phases = [e for e in events if isinstance(e, PhaseEvent)]
    assert [p.phase for p in phases] == ["loading_dataset", "dataset_loaded", "batches_per_epoch", "bucket",
                                         "bucket", "bucket", "loading_targets", "target_loading", "startup",
                                         "compiling", "finished"]
    # the note after a slow step is a plain line: never a step line, never a phase
    assert events[-2] == LogLine(len(events) - 1, "  step 1 compiled 2 graph(s) for a 16x1023 batch with 1024 "
                                                  "blocks in a 212.4s step (2 compiled so far)")
    assert phases[0].path == "/data/set with spaces" and phases[1].n_samples == 1234
    assert (phases[2].batch_min, phases[2].batch_max, phases[2].batch_avg) == (2, 40, 7.2)  # written with .1f
    assert [(b.lo, b.hi, b.n_batches) for b in phases[3:6]] == [(0, 16, 10), (16, 4096, 80), (4096, 10000, 9)]
    assert phases[5].pct == pytest.approx(100 * 9 / 99, abs=0.05)
    assert (phases[6].n_targets, phases[7].index, phases[7].device) == (1, 0, "cpu")
    assert (phases[8].stage, phases[8].elapsed_s) == ("compiling 1/2 (flex_attention, full_attention layers)", 41.2)


@pytest.mark.parametrize("line", ["Start-up [12s]:", "Start-up [x.1s]: loading target", "Start-up: loading target",
                                  "Start-up [1.0s] loading target"])
def test_malformed_start_up_lines_are_plain_lines(line):
    assert parse_all((line + "\n").encode()) == [LogLine(1, line)]


def test_writer_lifecycle_records():
    from orchestrator.trainlog.parser import parse_metrics_jsonl_record
    start = parse_metrics_jsonl_record(logformat.event_json("start", step=0, total_steps=10, world_size=1))
    finished = parse_metrics_jsonl_record(logformat.event_json("finished", step=10, digest="ab"))
    assert (start.phase, finished.phase) == ("training", "finished")
    assert parse_metrics_jsonl_record(logformat.event_json("checkpoint", step=5, path="/x")) is None
    assert parse_metrics_jsonl_line(logformat.event_json("finished", step=10)) is None


@pytest.mark.parametrize("line", ["", "{", "null", "[1, 2]", '{"event": "step"}', '{"step": "x"}',
                                  '{"event": [1], "step": 1}', b"\xff\xfe", '{"step": 1e400}', "1" * 100_000])
def test_metrics_jsonl_garbage_never_raises(line):
    event = parse_metrics_jsonl_line(line)
    assert event is None or event.partial


# ------------------------------------------------------------------------------------------ the byte stream


def test_chunks_split_inside_lines_and_utf8_sequences():
    data = "Loading dataset from /data/ünïcödé…...\n  5 samples loaded\nnot yet ended é".encode()
    whole = parse_all(data)
    assert whole[0].path == "/data/ünïcödé…" and whole[-1].text == "not yet ended é"
    for chunk in (1, 2, 3, 7):
        assert parse_all(data, chunk=chunk) == whole


def test_partial_line_waits_for_its_newline():
    parser = LogParser()
    line = SEED_STEPS.splitlines()[0]
    assert parser.feed(line[:50].encode()) == []
    (event,) = parser.feed((line[50:] + "\n").encode())
    assert isinstance(event, StepEvent) and not event.partial and event.line_no == 1
    assert parser.feed(b"tail without newline") == []
    (last,) = parser.flush()
    assert last == LogLine(2, "tail without newline") and parser.flush() == []


def test_carriage_return_redraws_keep_the_last_segment():
    data = b" 10%|#   |\r 50%|#####|\r100%|##########|\nwindows line\r\nredraw\r\rfinal\r\n"
    texts = [e.text for e in parse_all(data)]
    assert texts == ["100%|##########|", "windows line", "final"]
    assert [e.text for e in parse_all(data, chunk=1)] == texts


def test_a_redraw_that_shows_nothing_keeps_what_was_shown():
    data = b"\xff\r\x1b[31m\nloss 1.0\r\x1b[K\r\n\r\r\n"
    for chunk in (None, 1, 2):
        assert [e.text for e in parse_all(data, chunk=chunk)] == ["\ufffd", "loss 1.0", ""]


def test_ansi_codes_are_stripped():
    data = b"\x1b[31mred\x1b[0m \x1b]0;title\x07plain \x1b[2K\x1b[1G[6m] step=1 loss=\x1b[1m2.5\x1b[0m acc=0.\n"
    (event,) = parse_all(data)
    assert event.text == "red plain [6m] step=1 loss=2.5 acc=0." and isinstance(event, StepEvent)
    # the value the line ends on may be cut off mid-number: it is not trusted
    assert event.partial and (event.step, event.loss, event.acc, event.elapsed_s) == (1, 2.5, None, 360.0)


def test_invalid_utf8_is_replaced():
    (event,) = parse_all(b"bad \xff\xfe bytes \xe2\x82\n")
    assert event.text == "bad \ufffd\ufffd bytes \ufffd"


def test_huge_line_is_truncated_and_bounded(tmp_path):
    huge = b"x" * (3 * MAX_LINE_BYTES) + b"\n" + b"y" * (2 * MAX_LINE_BYTES)
    for chunk in (None, 4096, MAX_LINE_BYTES + 1):
        parser = LogParser()
        first, second = parse_all(huge, chunk=chunk, parser=parser)
        assert first.truncated and first.text == "x" * MAX_LINE_BYTES
        assert second.truncated and second.text == "y" * MAX_LINE_BYTES
    parser = LogParser()
    for _ in range(64):  # 16 MiB without a newline: memory stays at one capped line
        parser.feed(b"z" * 256 * 1024)
        assert len(parser._segment) <= MAX_LINE_BYTES


def test_huge_input_in_small_chunks_is_linear():
    data = b"a" * (8 * 1024 * 1024) + b"\n" + SEED_STEPS.encode() * 2000
    started = time.perf_counter()
    events = parse_all(data, chunk=1024)
    assert time.perf_counter() - started < 20  # quadratic re-scanning of the pending line would take minutes
    assert len(events) == 1 + 6000 and events[0].truncated


@pytest.mark.parametrize("line", [
    "a" * 65_000 + " Error:", "a." * 32_000 + " Error:", "Exception in thread " + "loss=1 " * 9_000 + "] step=",
    "[6m] step=1 loss=" + "(1" * 32_000, "Loading dataset from " + ".." * 32_000 + "x", "\x1b[" * 21_000 + "0",
])
def test_no_line_makes_the_parser_slow(line):
    started = time.perf_counter()
    (event,) = parse_all(line.encode() + b"\n")
    assert time.perf_counter() - started < 2  # a backtracking regex would take tens of seconds
    assert event.line_no == 1 and len(event.text) > 20_000  # kept, not dropped


def test_progress_bar_without_newline_keeps_only_its_last_redraw():
    parser = LogParser()
    for i in range(20_000):
        assert parser.feed(f"\r{i:6d}/20000 it".encode()) == []
    assert len(parser._segment) < 100
    assert [e.text for e in parser.feed(b"\n")] == [" 19999/20000 it"]


# ------------------------------------------------------------------------------------------ exceptions

CHAINED = """
def load():
    raise FileNotFoundError("weights.safetensors")
try:
    load()
except FileNotFoundError as error:
    try:
        raise RuntimeError("could not load the target") from error
    except RuntimeError:
        raise SystemError("giving up")
"""
THREAD_DIES_THEN_TRAINING_GOES_ON = """
import sys, threading
def drafter():
    raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function")
worker = threading.Thread(target=drafter, name="drafter-0")
worker.start(); worker.join()
print("[7m] step=9 loss=12.1 acc=0.030 streak=0.1", file=sys.stderr)
"""


def exceptions(events: list) -> list[ExceptionEvent]:
    return [e for e in events if isinstance(e, ExceptionEvent)]


def test_a_real_traceback_is_one_event_kept_whole():
    stderr = python_stderr("def f():\n    raise ValueError('boom: bad value')\nf()\n")
    events = parse_all(b"before\n" + stderr + b"after\n")
    assert [type(e) for e in events] == [LogLine, ExceptionEvent, LogLine]
    error = events[1]
    assert error.text == stderr.decode().rstrip("\n") and error.is_traceback
    assert (error.exc_type, error.message, error.line_no) == ("ValueError", "boom: bad value", 2)
    assert error.n_lines == stderr.count(b"\n") and events[2].line_no == 2 + error.n_lines


def test_chained_tracebacks_are_one_event():
    stderr = python_stderr(CHAINED)
    assert b"direct cause" in stderr and b"During handling" in stderr  # both kinds of chaining
    (error,) = parse_all(stderr)
    assert (error.exc_type, error.message) == ("SystemError", "giving up")
    assert error.text.count("Traceback (most recent call last):") == 3 and "FileNotFoundError" in error.text


def test_exception_in_thread_header_joins_its_traceback():
    stderr = python_stderr(THREAD_DIES_THEN_TRAINING_GOES_ON)
    error, step = parse_all(stderr)
    assert error.text.startswith("Exception in thread drafter-0") and error.line_no == 1
    assert error.exc_type == "RuntimeError" and error.message.startswith("Detected that you are using FX")
    assert isinstance(step, StepEvent) and step.step == 9


def test_exception_group():
    (error,) = parse_all(python_stderr("raise ExceptionGroup('workers', [ValueError(1), KeyError(2)])"))
    assert (error.exc_type, error.message) == ("ExceptionGroup", "workers (2 sub-exceptions)")
    assert "KeyError: 2" in error.text


def test_torchrun_prefixed_traceback():
    stderr = python_stderr("import json\njson.loads('{')")
    prefixed = b"".join(b"[rank1]: " + line for line in stderr.splitlines(keepends=True))
    (error,) = parse_all(prefixed + b"E1201 12:00:00 failed (exitcode: 1)\n")[:1]
    assert error.exc_type == "json.decoder.JSONDecodeError" and error.n_lines == stderr.count(b"\n")


def test_step_line_interleaved_into_a_traceback_is_its_own_event():
    lines = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
             SEED_STEPS.splitlines()[0], "    step()", "ZeroDivisionError: division by zero", "done"]
    step, error, done = parse_lines(lines)
    assert isinstance(step, StepEvent) and step.line_no == 3
    assert error.line_no == 1 and error.n_lines == 4 and "step()" in error.text and "step=" not in error.text
    assert done == LogLine(6, "done")


def test_an_unfinished_traceback_ends_where_the_next_one_begins():
    stderr = python_stderr(THREAD_DIES_THEN_TRAINING_GOES_ON)
    events = parse_all(b'Traceback (most recent call last):\n  File "a.py", line 1\n' + stderr)
    first, second, step = events
    assert (first.n_lines, first.exc_type, second.exc_type, second.line_no) == (2, None, "RuntimeError", 3)
    assert_every_line_accounted(events, stderr + b"\n\n")


def test_standalone_error_lines_count_once_each():
    lines = ["RuntimeError: Detected that you are using FX", "torch._dynamo hit an Exception in compile",
             "ERROR: nothing here (upper case is not what the seed grep counted)", "Error: disk full"]
    events = parse_lines(lines)
    assert [(e.exc_type, e.is_traceback) for e in exceptions(events)] == [
        ("RuntimeError", False), ("Exception", False), ("Error", False)]
    assert exceptions(events)[0].message == "Detected that you are using FX"


def test_traceback_at_the_end_waits_for_settle_or_flush():
    stderr = python_stderr("raise KeyError('gone')")
    parser = LogParser()
    assert parser.feed(stderr + b"partial") == []  # a chained block could still follow
    (error,) = parser.settle()
    assert error.exc_type == "KeyError" and parser.settle() == []
    assert parser.flush() == [LogLine(error.n_lines + 1, "partial")]


def test_blank_lines_after_a_traceback_stay_lines():
    stderr = python_stderr("raise KeyError('gone')")
    events = parse_all(stderr + b"\n\nnext\n")
    assert [type(e) for e in events] == [ExceptionEvent, LogLine, LogLine, LogLine]
    assert [e.line_no for e in events[1:]] == [events[0].n_lines + 1, events[0].n_lines + 2, events[0].n_lines + 3]


def test_an_unfinished_traceback_gives_up_on_a_flood_of_other_output():
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1'] + ["[6m] other output"] * 60
    events = parse_lines(lines)
    assert isinstance(events[0], LogLine) and len(exceptions(events)) == 1
    assert exceptions(events)[0].exc_type is None and len(events) == 61


def test_an_endless_traceback_keeps_head_and_tail():
    lines = ["Traceback (most recent call last):"] + [f'  File "f.py", line {i}' for i in range(50_000)]
    (error,) = parse_lines(lines + ["RecursionError: too deep"])
    assert error.n_lines == 50_002 and error.text.count("\n") < 2100
    assert 'line 0\n' in error.text and error.text.endswith("RecursionError: too deep") and "omitted" in error.text


# ------------------------------------------------------------------------------------------ fuzzing

PIECES = [
    b"\n", b"\r", b"\r\n", b"\x1b[31m", b"\x1b[0m", b"\x1b]0;t\x07", b"\x1b", b"\xff", b"\xe2\x82", b"\xc3\xa9",
    b"\x00", b" ", b"  ", b"[rank0]: ", b"Traceback (most recent call last):\n", b'  File "t.py", line 1\n',
    b"    x()\n", b"ValueError: bad\n", b"KeyboardInterrupt\n", b"Exception in thread w:\n", b"Error: x\n",
    b"\nDuring handling of the above exception, another exception occurred:\n\n",
    b"\nThe above exception was the direct cause of the following exception:\n\n",
    b"  + Exception Group Traceback (most recent call last):\n", b"  | ExceptionGroup: g (1 sub-exception)\n",
    b"  Bucket 1 [ 770,1216):   4437 batches (  7.4%)\n", b"Batches per epoch: 5 (min=1 max=2 avg=1.2.3)\n",
    b"step=", b"loss=nan ", b"q_pre=[1, ", b"] ", b"(1.5Ktok/s) ", b"ETA=", b"12.0d", b"[6m] ",
] + [line.encode() + b"\n" for line in (SEED_STARTUP + SEED_STEPS).splitlines()]
log_bytes = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=16)), max_size=80).map(b"".join)


def chunked(data: bytes, cuts: list[int], *, max_line_bytes: int = MAX_LINE_BYTES) -> list:
    parser, events, start = LogParser(max_line_bytes=max_line_bytes), [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += parser.feed(data[start:cut])
        start = cut
    return events + parser.flush()


def assert_every_line_accounted(events: list, data: bytes) -> None:
    counted = sum(e.n_lines if isinstance(e, ExceptionEvent) else 1 for e in events)
    lines = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    assert counted == lines


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_bytes, st.data())
def test_fuzz_chunked_equals_whole_and_never_raises(data, draw):
    cuts = draw.draw(st.lists(st.integers(min_value=0, max_value=len(data)), max_size=12))
    whole = chunked(data, [])
    assert repr(chunked(data, cuts)) == repr(whole)  # repr: NaN losses compare equal that way
    assert_every_line_accounted(whole, data)
    small_cap = chunked(data, cuts, max_line_bytes=7)  # truncation itself splits nothing differently
    assert repr(small_cap) == repr(chunked(data, [], max_line_bytes=7))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.data())
def test_fuzz_random_bytes(data, draw):
    cuts = draw.draw(st.lists(st.integers(min_value=0, max_value=len(data)), max_size=8))
    events = chunked(data, cuts)
    assert repr(events) == repr(chunked(data, []))
    assert_every_line_accounted(events, data)


@settings(max_examples=12, deadline=None)
@given(st.integers(min_value=1, max_value=3), st.sampled_from([p for p in PIECES if b"\n" not in p]), st.data())
def test_fuzz_megabyte_lines(n_lines, piece, draw):
    line = (piece * (1_000_000 // len(piece) + 1))[:1_000_000]
    data = (SEED_STEPS.encode() + line + b"\n") * n_lines
    cuts = draw.draw(st.lists(st.integers(min_value=0, max_value=len(data)), max_size=6))
    events = chunked(data, cuts)
    assert repr(events) == repr(chunked(data, []))
    assert all(len(e.text.encode()) <= 4 * MAX_LINE_BYTES for e in events if not isinstance(e, ExceptionEvent))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_line_parsers_never_raise(text):
    step = parse_step_line(text)
    assert step is None or step.step is not None
    record = parse_metrics_jsonl_line(text)
    assert record is None or isinstance(record, StepEvent)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)
jsonl_keys = st.sampled_from(["event", "v", "step", "loss", "acc", "lr", "q_pre", "q_hs", "tok_per_s", "eta_s",
                              "tgt_batches_per_s", "dft_batches_per_s", "elapsed_s", "epoch", "extra"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(jsonl_keys, json_values | st.sampled_from(["step", "inf", "nan", 10**400])))
def test_fuzz_metrics_records_never_raise(record):
    from orchestrator.trainlog.parser import parse_metrics_jsonl_record
    line = json.dumps(record)
    event = parse_metrics_jsonl_line(line)
    if event is not None:
        assert event.line_no is None and event.step in (None, record["step"])
    lifecycle = parse_metrics_jsonl_record(line)
    assert repr(lifecycle) == repr(event) or isinstance(lifecycle, PhaseEvent) or lifecycle is None


# ------------------------------------------------------------------------------------------ the real trainer


def run_python(*args: str, cwd: Path, log=None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "HOME": str(cwd)}
    output = {"stdout": log, "stderr": subprocess.STDOUT} if log else {"capture_output": True}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, timeout=300, **output)


@pytest.mark.slow
def test_a_real_training_run_log_and_metrics(tmp_path):
    """The trainer as a real process, stdout and stderr in one file as the supervisor writes it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trainer.model.tiny_target import tokenizer_corpus

    assert run_python("-m", "trainer", "tiny-target", "target", cwd=tmp_path).returncode == 0
    words = " ".join(tokenizer_corpus()).split()
    chats = [{"prompt": " ".join(words[i:i + 8]), "completion": " ".join(words[i + 8:i + 40])} for i in range(24)]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    prepared = run_python("-m", "trainer", "prepare", "--target", "target", "--input", "chats.jsonl",
                          "--output", "dataset", "--block-size", "8", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    (tmp_path / "train.yaml").write_text(json.dumps({
        "target_path": "target", "data_path": "dataset", "output_dir": "out", "max_steps": 4, "block_size": 8,
        "num_anchors": 8, "drafter_layers": 1, "token_budget": 2048, "buckets": [0, 128, 512], "log_every": 1,
        "checkpoint_every": 0, "device": "cpu", "num_workers": 1, "prefetch": 2}))
    with (tmp_path / "train.log").open("wb") as log:
        assert run_python("-m", "trainer", "train", "--config", "train.yaml", cwd=tmp_path, log=log).returncode == 0

    events = parse_all((tmp_path / "train.log").read_bytes(), chunk=333)
    steps = [e for e in events if isinstance(e, StepEvent)]
    phases = [e.phase for e in events if isinstance(e, PhaseEvent)]
    assert [s.step for s in steps] == [1, 2, 3, 4] and not any(s.partial for s in steps)
    assert phases[:3] == ["loading_dataset", "dataset_loaded", "batches_per_epoch"] and phases[-1] == "finished"
    assert not exceptions(events)
    records = [parse_metrics_jsonl_line(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r is not None]
    assert [r.step for r in records] == [1, 2, 3, 4] and not any(r.partial for r in records)
    for line, record in zip(steps, records, strict=True):
        assert line.loss == pytest.approx(record.loss, abs=5.1e-5) and line.q_pre == record.q_pre
        assert line.tok_per_s == pytest.approx(record.tok_per_s, abs=51)


def test_tau_fields_after_the_seed_format_are_read_whole_or_cut():
    line = ("[1m] step=3 loss=2.5 acc=0.400 streak=2.0 lr=1.00e-04 noise=0 | tgt=1.00b/s dft=1.00b/s "
            "(1.0Ktok/s) | q_pre=[1] q_hs=[1] | epoch~0.00 ETA=5.0m | tau_replay=2.100 tau_heldout=1.850")
    whole = parse_step_line(line)
    assert not whole.partial and (whole.tau_replay, whole.tau_heldout, whole.tau_eval) == (2.1, 1.85, None)
    cut = parse_step_line(line[:-3])  # the last value may be cut mid-number: it is left out, the rest is kept
    assert (cut.tau_replay, cut.tau_heldout, cut.loss) == (2.1, None, 2.5)
    plain = parse_step_line(line.split(" | tau_")[0])
    assert not plain.partial and plain.tau_replay is None  # a line without τ is whole, as the seed's are
    record = json.dumps({"event": "step", "step": 3, "loss": 2.5, "tau_replay": 2.1, "accept_hist": [0.5, 0.5]})
    assert parse_metrics_jsonl_line(record).tau_replay == 2.1


def test_tree_tau_per_node_budget_is_read_from_both_formats_whole_or_cut():
    line = ("[1m] step=3 loss=2.5 acc=0.400 streak=2.0 lr=1.00e-04 noise=0 | tgt=1.00b/s dft=1.00b/s "
            "(1.0Ktok/s) | q_pre=[1] q_hs=[1] | epoch~0.00 ETA=5.0m | tau_heldout=1.850 "
            "tau_tree_heldout=8:2.410,32:2.930,64:3.020")
    whole = parse_step_line(line)
    assert not whole.partial and whole.tau_heldout == 1.85
    assert whole.tau_tree_heldout == ((8, 2.41), (32, 2.93), (64, 3.02))
    for cut in (line[:-3], line[:-6], line[:-12]):  # cut inside a pair or after a comma: the field is left out
        event = parse_step_line(cut)
        assert (event.tau_heldout, event.tau_tree_heldout, event.loss) == (1.85, None, 2.5), cut
    garbled = parse_step_line(line.replace("32:2.930", "32:x") + " ")
    assert garbled.tau_heldout == 1.85 and garbled.tau_tree_heldout is None
    record = {"event": "step", "step": 3, "loss": 2.5, "tau_tree_heldout": {"32": 2.93, "8": 2.41}}
    assert parse_metrics_jsonl_line(json.dumps(record)).tau_tree_heldout == ((8, 2.41), (32, 2.93))
    for bad in ([8, 2.4], {"eight": 2.4}, {"8": "x"}, {}):
        assert parse_metrics_jsonl_line(json.dumps({**record, "tau_tree_heldout": bad})).tau_tree_heldout is None
