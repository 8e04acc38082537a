"""The README is a front door and docs/ holds the rest: nothing the old README said became unreachable, no link
points nowhere, every command has its line and its section, and doctor's fix lines name sections that exist."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import typer
from markdown_it import MarkdownIt
from mdit_py_plugins.anchors import anchors_plugin

from orchestrator.cli import app
from orchestrator.runs.doctor.report import GUIDE_PAGE, GUIDE_SECTIONS, see

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200
MAX_TABLE_CELL = 300

# Every heading of the README before it became a front door (572 lines); each must stay a heading of README or
# of a page README links to.
OLD_README_HEADINGS = (
    "dflashctl",
    "Start here",
    "The inventory",
    "Commands",
    "Notifications and a watcher that outlives your terminal",
    "The watch data path",
    "How a run survives",
    "Measured on the lab (real sshd + pct stand-in, 2-core machine; `python3 bench/bench_lifecycle.py`)",
    "Preparing a GPU container on Proxmox",
    "The bundled trainer",
    "Evaluating a drafter (`trainer eval`)",
    "τ in training: what predicts serving",
    "Training a drafter for Qwen3.6-27B",
    "Regenerating the training data on a GPU box",
    "Layout",
)


# Headings get the ids GitHub gives them (lower case, punctuation dropped, spaces as hyphens, repeats numbered).
PARSER = MarkdownIt("commonmark").enable("table").use(anchors_plugin, max_level=6)


@cache
def _tokens(page: Path) -> tuple:
    return tuple(PARSER.parse(page.read_text(encoding="utf-8")))


def _children(page: Path):
    for token in _tokens(page):
        yield token
        yield from token.children or ()


def headings(page: Path) -> list[str]:
    """Heading texts as written (inline code keeps its backticks), never a `#` line of a code block."""
    tokens = _tokens(page)
    return [tokens[i + 1].content for i, token in enumerate(tokens) if token.type == "heading_open"]


def anchors(page: Path) -> set[str]:
    return {token.attrs["id"] for token in _tokens(page) if token.type == "heading_open"}


def links(page: Path) -> list[str]:
    return [token.attrs["href"] for token in _children(page) if token.type == "link_open"]


def relative_links(page: Path) -> list[tuple[Path, str]]:
    """(file, anchor) of each link that stays in this repository; a bare `#anchor` is the page itself."""
    out = []
    for href in links(page):
        parts = urlsplit(href)
        if parts.scheme or parts.netloc:
            continue
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        out.append((target, unquote(parts.fragment)))
    return out


def linked_pages() -> list[Path]:
    return sorted({target for target, _ in relative_links(README) if target.suffix == ".md" and target.is_file()})


def doc_pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "RESULTS.md"]


def command_names() -> list[str]:
    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_the_readme_is_a_front_door_of_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_every_heading_of_the_old_readme_is_reachable_from_it() -> None:
    reachable = {text for page in [README, *linked_pages()] for text in headings(page)}
    lost = [text for text in OLD_README_HEADINGS if text not in reachable]
    assert not lost, f"no longer a heading of README or of a page it links to: {lost}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    pages = set(linked_pages())
    assert [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in pages] == []


def test_every_relative_link_resolves_to_a_file_and_its_anchor() -> None:
    broken = []
    for page in doc_pages():
        for target, anchor in relative_links(page):
            where = f"{page.relative_to(ROOT)} -> {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
                broken.append(f"{where}#{anchor}: no such heading")
    assert not broken, "\n".join(broken)


def table_cells(page: Path) -> list[str]:
    tokens = _tokens(page)
    return [token.content for before, token in zip(tokens, tokens[1:]) if before.type in ("td_open", "th_open")]


def test_no_table_cell_is_a_page_of_prose() -> None:
    long = [f"{page.relative_to(ROOT)}: {cell[:60]}..." for page in doc_pages() for cell in table_cells(page)
            if len(cell) > MAX_TABLE_CELL]
    assert not long, f"table cells over {MAX_TABLE_CELL} characters (make them prose or a list):\n" + "\n".join(long)


def test_each_command_has_its_line_in_the_readme_and_its_section_in_cli_md() -> None:
    readme = README.read_text(encoding="utf-8")
    reference = [text.strip("`") for text in headings(ROOT / "docs" / "cli.md")]
    names = command_names()
    assert {"doctor", "launch", "ps", "logs", "kill", "cleanup", "watch", "demo", "version"} <= set(names)
    missing_line = [n for n in names if not re.search(rf"^- \[?`dflashctl {n}\b", readme, re.MULTILINE)]
    missing_section = [n for n in names if f"dflashctl {n}" not in reference]
    assert not missing_line, f"commands without their line in README's list: {missing_line}"
    assert not missing_section, f"commands without a `dflashctl NAME` section in docs/cli.md: {missing_section}"


def cli_sections() -> dict[str, str]:
    """Command name -> the text of its `## dflashctl NAME` section of docs/cli.md."""
    sections = {}
    for part in re.split(r"^## ", (ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        found = re.match(r"`dflashctl (\w+)`", heading)
        if found:
            sections[found.group(1)] = body
    return sections


def test_every_option_of_every_command_is_in_its_section_of_cli_md() -> None:
    sections = cli_sections()
    missing = []
    for name, command in sorted(typer.main.get_command(app).commands.items()):
        for param in command.params:
            names = [*param.opts, *param.secondary_opts]
            if param.param_type_name == "option" and not any(
                    re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", sections.get(name, "")) for option in names):
                missing.append(f"{name} {names[0]}")
    assert not missing, f"options docs/cli.md does not document in their command's section: {missing}"


def test_each_guide_section_doctor_names_exists() -> None:
    page = ROOT / GUIDE_PAGE
    assert page.is_file()
    missing = sorted(set(GUIDE_SECTIONS.values()) - anchors(page))
    assert not missing, f"doctor's fix lines name sections {GUIDE_PAGE} lacks: {missing}"
    assert see("shm") == f"see {GUIDE_PAGE}#enough-devshm"


def test_every_page_and_anchor_the_controller_names_exists() -> None:
    """Any `docs/PAGE.md#anchor` written in the controller's code (a fix line, a help text) must exist."""
    named = {(m.group(1), m.group(2)) for path in (ROOT / "orchestrator").rglob("*.py")
             for m in re.finditer(r"\b(docs/[\w.-]+\.md)(?:#([\w\-\u0080-\uffff]+))?", path.read_text("utf-8"))}
    missing = [f"{page}#{anchor}" for page, anchor in sorted(named, key=str)
               if not (ROOT / page).is_file() or (anchor and anchor not in anchors(ROOT / page))]
    assert not missing, f"named by orchestrator/ but not there: {missing}"
