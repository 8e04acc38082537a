"""Every shared concept is defined once: a second definition is found here before the two drift apart."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dflash_records", "orchestrator", "tui", "trainer")
PROTOCOL = "dflash_records/protocol.py"
RESTART = "dflash_records/restart.py"
GPU = "dflash_records/gpu.py"
TRACEBACKS = "orchestrator/trainlog/tracebacks.py"
TERMINAL_TEXT = "dflash_records/terminaltext.py"
# the trainer imports nothing of the controller and keeps its own sizes, names and timeouts; the agent runs its
# own local commands with timeouts of its own
TRAINER, AGENT = ("trainer/",), ("trainer/", "dflash_agent/")
# the dashboard has no remote commands (its one literal timeout is how long a toast stays)
NOT_REMOTE = AGENT + ("tui/",)

# concept -> (a pattern that matches its definition, the one file that may hold it)
DEFINITIONS = {
    "run state names": (r"""["']killed["']|["']succeeded["']""", PROTOCOL),
    "terminal state tuple": (r"^\s*(TERMINAL|ENDED|LIVE)(_STATES)?\s*=\s*(frozenset|[({])", PROTOCOL),
    "run-id pattern": (r"\[A-Za-z0-9\]\[A-Za-z0-9\._-\]\{0,63\}", PROTOCOL),
    "ANSI escape regex": (r"\\x1b\\\[\[0-\?\]|ANSI_ESCAPE\.sub\(", TERMINAL_TEXT),
    "what a terminal shows of a line: the last \\r segment that shows anything": (
        r"""reversed\(\w+\.split\(b?["']\\r["']\)\)|in \w+\.split\(b?["']\\r["']\) if """, TERMINAL_TEXT),
    "nvidia-smi query fields": (r"[\"']--query-gpu=|^\s*GPU_\w*FIELDS\s*=", GPU),
    # the trainer's `tau_tree_heldout=8` is a held-out split, not a held GPU
    "GPU-held threshold": (r"^\s*\w*(HELD|held|min_memory)\w*\s*(:\s*\w+\s*)?=\s*[\d.]+", GPU, TRAINER),
    "protocol version": (r"^\s*PROTOCOL_VERSION\s*=", PROTOCOL),
    "state colours": (r"^\s*\w*(STATE_STYLES|COLORS|COLOURS)\s*=", "orchestrator/display.py"),
    "duration formatting": (r"^def format_duration\b", "orchestrator/display.py"),
    "exit codes": (r"^EXIT_(OK|FAILED|USAGE|UNREACHABLE)\s*=", PROTOCOL),
    "per-target results -> one exit code": (
        r"""\.error\.exit_code|getattr\(\w+\.error,\s*["']exit_code""",
        "orchestrator/transports/fanout.py"),
    "the worst of many exit codes": (r"max\([^)]*(exit_code|codes)", "orchestrator/errors.py"),
    "nvidia-smi CSV rows": (r"""["']\[N/A\]["']|def parse_query\w*\(""", GPU, TRAINER),
    # one GPU row: a class of its fields elsewhere is a second shape of it
    "a GPU row's fields": (r"^\s*memory_used_mib\s*:", GPU),
    "idle GPU holding memory": (r"utilization_pct\s*<|^\s*\w*IDLE_UTIL\w*\s*=", GPU),
    "the --env key rule": (r"ENV_KEY_PATTERN\.|^RESERVED_ENV_KEYS\s*=", PROTOCOL),
    "bytes in a KiB/MiB/GiB": (r"1024 \*\* [23]\b|^\s*[KMG]IB\s*=", PROTOCOL, TRAINER),
    "MiB as GiB": (r"def _?\w*gib\w*\(|[^/]/ 1024\b(?!\s*\*)", "orchestrator/display.py", TRAINER),
    "remote command timeouts": (r"timeout=\d|^(DEFAULT_TIMEOUT|\w+_TIMEOUT_S)\s*=\s*[\d.]+",
                                "orchestrator/transports/timeouts.py", NOT_REMOTE),
    "alert kind names": (r"""["'](gpu_idle|starvation|throughput|low_disk|log_reset)["']""",
                         "orchestrator/alertkinds.py", TRAINER),
    "reads of the trainer config": (r"from trainer\.(config|errors) import|import trainer\.(config|errors)\b",
                                    "orchestrator/runs/trainerconfig.py", TRAINER),
    "what an exception line looks like": (r"Segmentation fault|most recent call last\)", TRACEBACKS),
    "ISO time stamps of records": (r"\.isoformat\(", PROTOCOL, TRAINER),
    "whether a text names a run": (r"RUN_ID_PATTERN\.(fullmatch|match|search)\(", PROTOCOL),
    "the .dflash folder of a workdir": (r"""f["'][^"'\n]*/\.dflash\b|^STATE_DIR\s*=""", PROTOCOL),
    "a text cut short with an ellipsis": (r"""\+\s*["']…["']""", "orchestrator/display.py", TRAINER),
    "a column's widest cell": (r"max\([^)\n]*cell_len", "orchestrator/display.py"),
    # the agent's supervisor, the controller and a job's workers (the trainer) all follow the one restart policy
    "the restart policy's names and bounds": (r"""^\s*BACKOFF_(MAX|BASE)_S\s*=|["']on-failure["']""", RESTART),
    "a backoff doubling up to a cap": (r"\*\s*2(\.0)?\s*\*\*\s*min\(", RESTART),
    # the trainer's manifest.json, the agent's pull plan and the controller's check of what it received
    "a file's sha256, read in chunks": (r"^HASH_CHUNK\s*=|read\([^)\n]*HASH_CHUNK", "dflash_records/digest.py"),
    "what a job's workers read of a restart": (
        r"""["'](DFLASH_RESTART_BACKOFF_S|TORCHELASTIC_RESTART_COUNT)["']""", RESTART),
}


def sources() -> dict[str, str]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            files[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return files


@pytest.mark.parametrize("concept", sorted(DEFINITIONS))
def test_each_concept_is_defined_in_exactly_one_module(concept: str) -> None:
    # the home must match too: a pattern that matches nothing would pass for ever
    pattern, home, *skip = DEFINITIONS[concept]
    regex = re.compile(pattern, re.MULTILINE)
    holders = sorted(name for name, text in sources().items()
                     if regex.search(text) and not name.startswith(tuple(*skip)))
    assert holders == [home], f"{concept}: defined in {holders}, expected only in {home}"


def test_digits_are_checked_in_one_place() -> None:
    # str.isdigit()/isnumeric()/isdecimal() take '²', '①' or '٣': whether a text is a number is dflash_records'
    # ascii_decimal, which the trainer imports too
    check = re.compile(r"\.is(digit|numeric|decimal)\(\)")
    holders = sorted(name for name, text in sources().items() if check.search(text))
    assert holders == ["dflash_records/digits.py"]


def test_no_literal_exit_code_comparisons() -> None:
    literal = re.compile(r"exit_code\s*==\s*\d|return [123]\s*$", re.MULTILINE)
    cli = {name: text for name, text in sources().items() if name.startswith("orchestrator/cli/")}
    offenders = sorted(name for name, text in cli.items() if literal.search(text))
    assert offenders == []


def test_ps_and_the_dashboard_colour_every_state_alike() -> None:
    from dflash_records.protocol import RUN_STATES
    from orchestrator.cli.ps import _state
    from orchestrator.watch.model import RunView
    from tui.runcells import run_cells

    for state in RUN_STATES:
        run = RunView(run_id="r-1", target="local", name="r", state=state)
        dashboard = run_cells(run)["state"].style
        assert _state(state) == f"[{dashboard}]{state}[/]", state


# lines a terminal shows differently from their bytes: (raw line, what it shows)
SHOWN = [
    (b"loss=1.0\r\x1b[0m", "loss=1.0"),   # a colour reset after the redraw draws nothing over the text
    (b"10%\r50%\r100%", "100%"),
    (b"done\r", "done"),
    (b"\x1b[32mok\x1b[0m", "ok"),
    (b"\x1b]0;title\x07step 3", "step 3"),
    (b"\r\r", ""),
]


def test_the_agent_the_parser_and_the_dashboard_show_a_line_alike(tmp_path: Path) -> None:
    from dflash_agent.lineindex import read_lines
    from orchestrator.trainlog.parser import LogLine, LogParser
    from tui.loghighlight import clean_line

    run_dir = tmp_path / "r-1"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    (run_dir / "train.log").write_bytes(b"".join(raw + b"\n" for raw, _ in SHOWN))
    expected = [shown for _, shown in SHOWN]
    assert list(read_lines(str(tmp_path), "r-1", 0, len(SHOWN)).lines) == expected
    parser = LogParser()
    events = parser.feed(b"".join(raw + b"\n" for raw, _ in SHOWN)) + parser.flush()
    assert [e.text for e in events if isinstance(e, LogLine)] == expected
    byte_by_byte = LogParser()
    events = [e for raw, _ in SHOWN for byte in raw + b"\n" for e in byte_by_byte.feed(bytes([byte]))]
    assert [e.text for e in events if isinstance(e, LogLine)] == expected
    assert [clean_line(raw.decode()) for raw, _ in SHOWN] == expected


# ------------------------------------------------------------------------------------------ the records
# A record's fields are declared once, in dflash_records/: a class that declares (nearly) all of them, or a
# literal list naming many of them, is a second definition. A view that holds some of a record's latest values
# (RunView, MetricPoint, the bottleneck's signals) is not.

RECORD_HOMES = {"step record": "dflash_records/step.py", "run record": "dflash_records/run.py"}
SCANNED = ("dflash_records", "orchestrator", "tui", "trainer", "tests", "bench")
MOST = 0.75   # of a record's fields, declared by one class
MANY = 8      # of a record's field names, in one literal list


def record_fields() -> dict[str, set[str]]:
    from dflash_records.run import RECORD_KEYS
    from dflash_records.step import RECORD_FIELDS
    return {"step record": set(RECORD_FIELDS), "run record": set(RECORD_KEYS)}


def declarations(tree: ast.Module, names: set[str]) -> list[str]:
    """Where `tree` declares the record whose field names are `names`: classes and literal name lists."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            declared = {item.target.id for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
            if len(declared & names) >= MOST * len(names):
                found.append(f"class {node.name}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(strings) >= MANY and len(strings) == len(node.elts) and strings <= names:
                found.append(f"a list of {len(strings)} of its names, line {node.lineno}")
    return found


def scanned_trees() -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for top in SCANNED for path in sorted((ROOT / top).rglob("*.py")) if "__pycache__" not in path.parts}


@pytest.mark.parametrize("record", sorted(RECORD_HOMES))
def test_each_records_fields_are_declared_once(record: str) -> None:
    names = record_fields()[record]
    holders = {name: found for name, tree in scanned_trees().items() if (found := declarations(tree, names))}
    assert list(holders) == [RECORD_HOMES[record]], f"{record} declared in {holders}"


# The controller reads the agent's answers and run records typed (dflash_records/answers.py, plans.py, run.py,
# parsed once where the agent call returns), not as the wire's dicts by key: a field renamed or retyped there is
# then found by every reader at once. No key a run record field shares is read here, of whatever variable.
READ_TYPED = ("orchestrator/cli/logs.py", "orchestrator/cli/demo.py", "orchestrator/runs/pull.py",
              "orchestrator/runs/jobs.py", "orchestrator/watch/alerts.py", "orchestrator/watch/jobrows.py",
              "orchestrator/notify/relaunch.py", "orchestrator/runs/addressing.py", "orchestrator/runs/client.py",
              "orchestrator/cli/launch.py", "orchestrator/cli/kill.py", "orchestrator/cli/ps.py",
              "orchestrator/cli/launcheach.py", "orchestrator/cli/cleanup.py", "orchestrator/cli/launchreport.py",
              "orchestrator/runs/whereabouts.py", "orchestrator/runs/fetch.py")


def keyed_reads(tree: ast.Module) -> list[tuple[str, str, int]]:
    """(what is read, the key, the line) of each `x["key"]` read and `x.get("key")` in `tree`."""
    reads = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            reads.append((ast.unparse(node.value), node.slice.value, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            reads.append((ast.unparse(node.func.value), node.args[0].value, node.lineno))
    return reads


def test_the_run_record_is_read_typed() -> None:
    fields = record_fields()["run record"]
    by_key = [f"{name}:{line} {what}[{key!r}]"
              for name in READ_TYPED for what, key, line in keyed_reads(ast.parse((ROOT / name).read_text()))
              if key in fields]
    assert by_key == []
