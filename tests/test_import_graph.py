"""The import graph of dflash_records/, dflash_agent/, orchestrator/, tui/ and trainer/ has no circle and runs one
way: tui -> orchestrator -> transports, the agent alone (the controller imports it only to bundle it), the trainer
beside the controller, and dflash_records (the records both bundles carry) under all of them.

Every import counts, a function-local one too: an import moved into a function to dodge a circle still makes
the two modules depend on each other, and it is how the last circle (14 controller modules) stayed hidden.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dflash_records", "dflash_agent", "orchestrator", "tui", "trainer")
AGENT = "dflash_agent"
# the one controller module that imports the agent: to pack it into the zipapp, never to call it
BUNDLER = "orchestrator.runs.bundle"
# the records every side shares: shipped in the agent's zipapp and the trainer's tar, so it imports nothing of ours
RECORDS = "dflash_records"
# what the transports may use of the rest of the controller: the error root, the inventory they connect to
TRANSPORTS_MAY_IMPORT = ("orchestrator.errors", "orchestrator.inventory.", "dflash_records.protocol")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of the five packages; a package under its own name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports anywhere in its body: `from pkg import name` is the module
    `pkg.name` where that is a module (the package is only being walked through), else the package `pkg`."""
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[name] = {target for target in targets if target in files and target != name}
    return graph


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as [a, b, ..., a], or None; depth-first, iterative (the graph has ~300 nodes)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:  # every import of path[-1] explored: no circle through it
                done.add(path.pop())
                stack.pop()
            elif following in path:
                return path[path.index(following):] + [following]
            elif following not in done:
                path.append(following)
                stack.append(iter(sorted(graph[following])))
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(module_files())


def test_no_module_imports_itself_back_through_others(graph: dict[str, set[str]]) -> None:
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle_closed_by_a_function_local_import(tmp_path: Path) -> None:
    # the shape of the circle the issue found: a module-level import one way, a function-local one back
    (tmp_path / "orchestrator" / "watch").mkdir(parents=True)
    (tmp_path / "tui").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "watch" / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "kinds.py").write_text("from .watch.alerts import STALL\n")
    (tmp_path / "orchestrator" / "watch" / "alerts.py").write_text(
        "STALL = 'stall'\n\ndef rules():\n    from ..kinds import KINDS  # dodges the circle\n    return KINDS\n")
    cycle = find_cycle(import_graph(module_files(tmp_path)))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"orchestrator.kinds", "orchestrator.watch.alerts"}


def package_graph(graph: dict[str, set[str]], files: dict[str, Path]) -> dict[str, set[str]]:
    """The module graph folded onto the packages one level in (orchestrator.inventory, tui.widgets, ...); a root
    module (orchestrator.errors) stays itself. An edge is an import from one package's module into another's."""
    packages = {name for name, path in files.items() if path.name == "__init__.py"}

    def home(module: str) -> str:
        top = ".".join(module.split(".")[:2])
        return top if top in packages and top.count(".") == 1 else module

    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        folded.setdefault(home(name), set()).update(home(t) for t in targets if home(t) != home(name))
    return folded


def test_no_package_imports_itself_back_through_others(graph: dict[str, set[str]]) -> None:
    # modules in a circle of packages need not import each other (inventory/notify.py read notify/kinds.py while
    # notify/destinations.py read inventory/model.py): the packages still cannot be understood, or moved, apart
    cycle = find_cycle(package_graph(graph, module_files()))
    assert cycle is None, "package import circle: " + " -> ".join(cycle or [])


def test_the_package_check_finds_a_circle_no_module_closes(tmp_path: Path) -> None:
    for package in ("orchestrator", "orchestrator/inventory", "orchestrator/notify", "tui", "trainer"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "inventory" / "spec.py").write_text("from ..notify.kinds import KINDS\n")
    (tmp_path / "orchestrator" / "inventory" / "model.py").write_text("from .spec import KINDS\n")
    (tmp_path / "orchestrator" / "notify" / "kinds.py").write_text("KINDS = ()\n")
    (tmp_path / "orchestrator" / "notify" / "sender.py").write_text("from ..inventory.model import KINDS\n")
    files = module_files(tmp_path)
    modules = import_graph(files)
    assert find_cycle(modules) is None
    assert set(find_cycle(package_graph(modules, files)) or ()) == {"orchestrator.inventory", "orchestrator.notify"}


def _offenders(graph: dict[str, set[str]], importer: str, allowed) -> list[str]:
    return sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith(importer)
                  for target in targets if not allowed(target))


def test_the_transports_use_only_the_errors_the_inventory_and_the_protocol(graph: dict[str, set[str]]) -> None:
    def allowed(target: str) -> bool:
        return target.startswith("orchestrator.transports") or target.startswith(TRANSPORTS_MAY_IMPORT)

    assert _offenders(graph, "orchestrator.transports", allowed) == []


def test_the_controller_never_imports_the_dashboard_except_to_open_it(graph: dict[str, set[str]]) -> None:
    # DESIGN.md: tui -> orchestrator; the two commands that open the dashboard are the one way back
    openers = ("orchestrator.cli.watch", "orchestrator.cli.demo")
    offenders = [line for line in _offenders(graph, "orchestrator", lambda t: not t.startswith("tui"))
                 if line.split(" -> ")[0] not in openers]
    assert offenders == []


def test_the_agent_imports_nothing_outside_itself_and_the_records(graph: dict[str, set[str]]) -> None:
    # it is shipped as a zipapp with the records beside it: anything else of the project would be missing there
    assert _offenders(graph, AGENT, lambda t: t.startswith((AGENT, RECORDS))) == []


def test_the_controller_and_the_dashboard_import_the_agent_only_to_bundle_it(graph: dict[str, set[str]]) -> None:
    # they speak to it over the wire, in dflash_records' types; its code runs in the containers, not here
    offenders = [line for importer in ("orchestrator", "tui")
                 for line in _offenders(graph, importer, lambda t: not t.startswith(AGENT))
                 if line.split(" -> ")[0] != BUNDLER]
    assert offenders == []
    assert any(target.startswith(AGENT) for target in graph[BUNDLER])


def test_the_trainer_imports_neither_the_controller_nor_the_dashboard(graph: dict[str, set[str]]) -> None:
    # the records are shipped in its tar beside it
    assert _offenders(graph, "trainer", lambda t: t.startswith(("trainer", RECORDS))) == []


def test_the_records_import_nothing_of_the_project(graph: dict[str, set[str]]) -> None:
    # the bottom of the graph: whatever imports them, alone on a target, has them whole
    assert _offenders(graph, RECORDS, lambda t: t.startswith(RECORDS)) == []
    assert any(target.startswith(RECORDS) for name, targets in graph.items() if name.startswith(AGENT)
               for target in targets)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for following in graph[todo.pop()] - seen:
            seen.add(following)
            todo.append(following)
    return seen


def test_the_inventory_reads_alert_kinds_from_a_leaf_not_from_the_alert_engine(graph: dict[str, set[str]]) -> None:
    # the validator of `notify: kinds` needs seven strings; the engine drags in the log parser and the display
    reached = _reach(graph, "orchestrator.inventory.model")
    assert "orchestrator.alertkinds" in reached
    assert sorted(name for name in reached if name.startswith(("orchestrator.watch.alerts", "orchestrator.trainlog"))) \
        == []
