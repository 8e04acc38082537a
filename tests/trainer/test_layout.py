"""trainer/'s layout: the commands and the contracts at the root, five rooms below it, imports running one way
only (a lower room never imports a higher one), and the part the controller reads importing no [train] package."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layout import imported
from tests.trainer.conftest import REPO_ROOT, trainer_env

TRAINER = REPO_ROOT / "trainer"
COMMANDS = ("__init__", "__main__", "train", "export")   # `python -m trainer ...` and what it runs
# shared with the controller (yamlbound: how config reads YAML safely; objectives: what its `loss:` may say); every
# room may read them
CONTRACTS = ("config", "errors", "logformat", "objectives", "yamlbound")
ROOMS = ("planning", "model", "data", "decoding", "training")  # lowest first: each imports only those before it
# what the controller imports of the trainer (DESIGN.md: the config adapter, `check`), in a fresh process each
CONTROLLER_READS = [f"trainer.{name}" for name in CONTRACTS] + sorted(
    f"trainer.planning.{path.stem}" for path in (TRAINER / "planning").glob("*.py") if path.stem != "__init__")
# packages of the [train] extra (and numpy, which they bring): a controller-only install has none of them
TRAIN_EXTRA = ("torch", "transformers", "datasets", "pyarrow", "safetensors", "numpy")


def modules() -> dict[str, Path]:
    """Dotted name -> file of every trainer module; a package's __init__.py under the package's name."""
    found = {}
    for path in sorted(TRAINER.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def floor(module: str) -> int:
    """0 for the contracts, 1.. for the rooms in order, above them the commands."""
    parts = module.split(".")
    if len(parts) > 2 or parts[1] in ROOMS:
        return 1 + ROOMS.index(parts[1])
    return 0 if parts[1] in CONTRACTS else 1 + len(ROOMS)


def test_the_root_holds_only_the_commands_and_the_contracts_and_every_folder_is_a_room() -> None:
    assert sorted(path.stem for path in TRAINER.glob("*.py")) == sorted(COMMANDS + CONTRACTS)
    folders = sorted(path.name for path in TRAINER.iterdir() if path.is_dir() and any(path.glob("*.py")))
    assert folders == sorted(ROOMS)


def test_a_package_face_only_names_its_room() -> None:
    """The rooms' __init__.py files hold a docstring and nothing else: importing a room loads none of it."""
    faces = {name: ast.parse(path.read_text()) for name, path in modules().items() if path.name == "__init__.py"}
    assert {name: len(tree.body) for name, tree in faces.items() if len(tree.body) != 1} == {}
    assert all(ast.get_docstring(tree) for tree in faces.values())


def test_imports_run_from_the_commands_down_through_the_rooms_to_the_contracts() -> None:
    known = modules()
    upward = []
    for name, path in known.items():
        if path.name == "__init__.py":
            continue
        for target in sorted(imported(ast.parse(path.read_text()), name) & known.keys()):
            if known[target].name != "__init__.py" and floor(target) > floor(name):
                upward.append(f"{name} -> {target}")
    assert upward == []


@pytest.mark.parametrize("module", CONTROLLER_READS)
def test_what_the_controller_reads_imports_no_train_extra(module: str) -> None:
    probe = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
             "print(' '.join(name for name in sys.argv[2:] if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, module, *TRAIN_EXTRA], capture_output=True, text=True,
                          timeout=120, env=trainer_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
