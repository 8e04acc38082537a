"""docs/design.md's layout map names every module of the packages: a module added without its line there fails
here, so the map stays the place a newcomer finds where a thing lives.

The rule, for whoever edits the map (the code block under `## Layout`):
- a line whose text begins at column 0 is a top-level folder (`orchestrator/`), one that begins at column 2 is
  a file (`errors.py`) or a folder (`runs/`, `runs/doctor/`) inside the top-level folder above it; every other
  line continues the entry above it;
- a module `FOLDER/NAME.py` is named when `NAME.py` appears in FOLDER's section: FOLDER's own entry with its
  continuation lines, and the file entries directly inside FOLDER (its sub-folders have sections of their own).
`__init__.py` needs no mention; every other module does, `__main__.py` too.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
NOT_PACKAGES = ("tests", "bench")      # folders with an __init__.py that are no part of the program
KNOWN = {"dflash_records", "dflash_agent", "orchestrator", "tui", "trainer"}
ENTRY = re.compile(r"( {0,2})(\S+)(.*)")


def packages(root: Path = ROOT) -> list[str]:
    return sorted(init.parent.name for init in root.glob("*/__init__.py") if init.parent.name not in NOT_PACKAGES)


def modules(root: Path = ROOT) -> list[str]:
    """Every module of the packages but the `__init__.py`s, as a /-path from the root."""
    return sorted(path.relative_to(root).as_posix() for package in packages(root)
                  for path in (root / package).rglob("*.py")
                  if path.name != "__init__.py" and "__pycache__" not in path.parts)


def layout_map(text: str) -> list[str]:
    """The lines of the code block under `## Layout`."""
    after = text.split("\n## Layout\n", 1)[1]
    return after.split("```", 2)[1].splitlines()[1:]


def sections(lines: list[str]) -> dict[str, str]:
    """Folder (a /-path from the root) -> the text of its section, by the rule above."""
    found: dict[str, list[str]] = {}
    top, owner = "", ""
    for line in lines:
        entry = ENTRY.fullmatch(line) if line[:1] != " " or line[2:3] != " " else None
        if entry and len(entry.group(1)) in (0, 2):
            indent, name, rest = len(entry.group(1)), entry.group(2), entry.group(3)
            if indent == 0:
                top = owner = name.rstrip("/")
                line = rest
            elif name.endswith("/"):
                owner = f"{top}/{name.rstrip('/')}"
                line = rest
            else:
                owner = top   # a file entry: its whole line belongs to the top-level folder's section
        found.setdefault(owner, []).append(line)
    return {folder: "\n".join(text) for folder, text in found.items()}


def unnamed(modules_: list[str], sections_: dict[str, str]) -> list[str]:
    missing = []
    for module in modules_:
        folder, _, name = module.rpartition("/")
        if not re.search(rf"(?<![\w./-]){re.escape(name)}(?![\w.])", sections_.get(folder, "")):
            missing.append(module)
    return missing


def test_the_layout_map_names_every_module() -> None:
    assert KNOWN <= set(packages())   # the folders are found, so a pass is not an empty check
    found = sections(layout_map(DESIGN.read_text(encoding="utf-8")))
    assert unnamed(modules(), found) == []


def test_a_module_named_only_in_another_folders_section_counts_as_missing() -> None:
    lines = ["orchestrator/              the controller",
             "  errors.py                the exception root (the codes are in agent/protocol.py)",
             "  agent/                   cli.py, protocol.py",
             "                           and launch.py",
             "trainer/                   the trainer; config.py"]
    found = sections(lines)
    assert unnamed(["orchestrator/errors.py", "orchestrator/agent/launch.py", "trainer/config.py"], found) == []
    assert unnamed(["orchestrator/protocol.py", "orchestrator/agent/errors.py", "trainer/cli.py"], found) == \
        ["orchestrator/protocol.py", "orchestrator/agent/errors.py", "trainer/cli.py"]
