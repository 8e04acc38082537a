"""The controller's layout stays livable: a small root, small modules and functions, imports one way only."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTROLLER = ("orchestrator", "tui")
# the records every side shares (the trainer's and the agent's bundles carry it): held to the controller's sizes
RECORDS = ("dflash_records",)
MAX_ROOT_MODULES = 10
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for package in CONTROLLER + RECORDS for path in sorted((ROOT / package).rglob("*.py"))}


def imported(tree: ast.Module, name: str) -> set[str]:
    """Absolute names of every module `tree` (the module `name`) imports, relative imports resolved."""
    package = name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_orchestrator_root_holds_at_most_ten_modules() -> None:
    root = sorted(path.name for path in (ROOT / "orchestrator").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_module_and_no_function_is_too_long() -> None:
    too_long = []
    for name, tree in modules().items():
        lines = (ROOT / name).read_text(encoding="utf-8").count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []


TRAINER_LOOP = "trainer/train.py:train"  # the training loop reads best as one function
# every checkpoint ships this file alone (AutoModel with trust_remote_code): it can import nothing of ours, so it
# holds DFlash and DFlash2 whole; its functions are held to the limit like any other
SHIPPED_ALONE = "trainer/model/modeling_dflash.py"


def test_trainer_modules_and_functions_are_small_too() -> None:
    too_long = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES and name != SHIPPED_ALONE:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and f"{name}:{node.name}" != TRAINER_LOOP:
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}")
        if not ast.get_docstring(ast.parse(text)):
            too_long.append(f"{name}: no opening docstring")
    assert too_long == []


def test_every_module_opens_with_a_docstring() -> None:
    assert [name for name, tree in modules().items() if not ast.get_docstring(tree)] == []


def test_the_tui_never_reaches_back_into_the_cli() -> None:
    offenders = []
    for name, tree in modules().items():
        if name.startswith("tui/"):
            dotted = name[:-3].replace("/", ".")
            if any(module == "orchestrator.cli" or module.startswith("orchestrator.cli.")
                   for module in imported(tree, dotted)):
                offenders.append(name)
    assert offenders == []


# the commands that open the dashboard; nothing else in orchestrator/ knows the tui exists
DASHBOARD_OPENERS = ("orchestrator/cli/watch.py", "orchestrator/cli/demo.py")


def test_the_controller_imports_no_torch_and_only_the_dashboard_commands_import_the_tui() -> None:
    for name, tree in modules().items():
        dotted = name[:-3].replace("/", ".")
        names = imported(tree, dotted)
        assert not any(module.split(".")[0] in {"torch", "transformers"} for module in names), name
        if name.startswith("orchestrator/") and name not in DASHBOARD_OPENERS:
            assert not any(module.split(".")[0] == "tui" for module in names), name


# ------------------------------------------------------------------------------------------------ tests/

TESTS = ROOT / "tests"
# the only homes of a polling loop: the sync one, and its async twin that awaits Pilot's pauses
POLLING_HOMES = ("tests/polling.py", "tests/tui/conftest.py")
# where tests may use the lab: the lab tests' folder, and the lab's own self-tests
LAB_HOMES = ("tests/on_lab/", "tests/lab/")


def suite_modules() -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(TESTS.rglob("*.py")) if "__pycache__" not in path.parts}


def unmirrored_folders(unit: Path, package: str) -> list[str]:
    """Each folder of tests/<package>/ that is no package of <package>/, or no package itself (without an __init__.py
    two folders' test_x.py would collide)."""
    folders = [folder for folder in sorted(unit.rglob("*")) if folder.is_dir() and folder.name != "__pycache__"]
    return ([f"{folder.relative_to(ROOT)}: no {package}/{folder.relative_to(unit).as_posix()} package"
             for folder in folders if not (ROOT / package / folder.relative_to(unit) / "__init__.py").is_file()]
            + [f"{folder.relative_to(ROOT)}: no __init__.py" for folder in folders
               if not (folder / "__init__.py").is_file()])


def test_the_controllers_tests_mirror_its_packages() -> None:
    unit = TESTS / "orchestrator"
    strays = unmirrored_folders(unit, "orchestrator")
    root_modules = {path.stem for path in (ROOT / "orchestrator").glob("*.py")}
    strays += [f"{path.relative_to(ROOT)}: tests no root module of orchestrator/; its package's folder is the home"
               for path in sorted(unit.glob("test_*.py")) if path.stem.removeprefix("test_") not in root_modules]
    assert strays == []


# the trainer's own whole-tree check (its root, the order of its rooms) sits at the top of its tests
TRAINER_WHOLE_TREE = ("test_layout.py",)


def test_the_trainers_tests_mirror_its_rooms() -> None:
    """A room's tests live in tests/trainer/<room>/; directly in tests/trainer/ only a root module's tests, named
    test_<module>.py or test_<module>_<aspect>.py (__main__'s test_main_...), and the whole-tree check."""
    unit = TESTS / "trainer"
    strays = unmirrored_folders(unit, "trainer")
    root_modules = {path.stem.strip("_") for path in (ROOT / "trainer").glob("*.py")} - {"init"}
    strays += [f"{path.relative_to(ROOT)}: tests no root module of trainer/; its room's folder is the home"
               for path in sorted(unit.glob("test_*.py")) if path.name not in TRAINER_WHOLE_TREE
               and not any(path.stem == f"test_{module}" or path.stem.startswith(f"test_{module}_")
                           for module in root_modules)]
    assert strays == []


def test_every_test_that_uses_the_lab_lives_in_tests_on_lab() -> None:
    """A test or fixture taking the `lab` fixture; the ones that take such a fixture live beside it."""
    outside = [f"{name}:{node.lineno} {node.name}"
               for name, tree in suite_modules().items()
               if name.rsplit("/", 1)[-1].startswith(("test_", "conftest")) and not name.startswith(LAB_HOMES)
               for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and "lab" in [arg.arg for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]]
    assert outside == []


def test_one_polling_loop() -> None:
    """A function named for waiting (wait_for, wait_until, poll...) that loops is a copy of tests/polling.py's."""
    copies = [f"{name}:{node.lineno} {node.name}"
              for name, tree in suite_modules().items() if name not in POLLING_HOMES
              for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and node.name.lstrip("_").startswith(("wait", "poll", "until", "eventually", "assert_eventually"))
              and any(isinstance(inner, (ast.While, ast.For, ast.AsyncFor)) for inner in ast.walk(node))]
    assert copies == []
