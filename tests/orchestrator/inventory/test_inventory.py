"""Inventory validation: every bad case is exit 2 with file:line and the field, never a traceback."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import InventoryError, TargetNotFound
from orchestrator.inventory.model import load_inventory, parse_inventory

GOOD = """\
defaults: {user: root, workdir: /workspace, python: python3}
hosts:
  pve1:
    address: 10.1.2.6
    pct: sudo pct
    containers:
      200: {gpus: 8, python: /workspace/venv/bin/python}
      201: {gpus: 0, workdir: /data}
  bare:
    address: gpu-box
    port: 2222
    gpus: 2
  local:
    transport: local
"""

BAD = {
    "unknown key": ("hosts:\n  pve1:\n    address: x\n    adress: y\n", 4, "hosts.pve1.adress", "unknown key"),
    "missing address": ("hosts:\n  pve1:\n    port: 22\n", 2, "hosts.pve1.address", "needs an address"),
    "port out of range": ("hosts:\n  pve1:\n    address: x\n    port: 70000\n", 4, "hosts.pve1.port", "65535"),
    "port zero": ("defaults:\n  port: 0\nhosts: {}\n", 2, "defaults.port", "greater than or equal to 1"),
    "duplicate container": ("hosts:\n  pve1:\n    address: x\n    containers:\n      200: {}\n      '200': {}\n",
                            6, "hosts.pve1.containers.200", "duplicate"),
    "container under local": ("hosts:\n  local:\n    transport: local\n    containers:\n      200: {}\n",
                              4, "hosts.local.containers", "local host has no containers"),
    "non-integer ctid": ("hosts:\n  pve1:\n    address: x\n    containers:\n      web: {}\n",
                         5, "hosts.pve1.containers.web", "integer"),
    # str.isdigit() takes these, int() refuses the first two and reads the third as 3: none is a CTID
    "superscript ctid": ("hosts:\n  pve1:\n    address: x\n    containers:\n      \"\u00b2\": {}\n",
                         5, "hosts.pve1.containers.\u00b2", "integer CTID (digits 0-9)"),
    "circled ctid": ("hosts:\n  pve1:\n    address: x\n    containers:\n      \u2460: {}\n",
                     5, "hosts.pve1.containers.\u2460", "integer CTID (digits 0-9)"),
    "arabic-indic ctid": ("hosts:\n  pve1:\n    address: x\n    containers:\n      \u0663: {}\n",
                          5, "hosts.pve1.containers.\u0663", "integer CTID (digits 0-9)"),
    "yaml syntax": ("hosts:\n  pve1:\n    address: [x\n  pve2: {}\n", 4, "", "YAML syntax error"),
    "container typo": ("hosts:\n  pve1:\n    address: x\n    containers:\n      200: {gpu: 8}\n",
                       5, "hosts.pve1.containers.200.gpu", "did you mean 'gpus'"),
    "negative gpus": ("hosts:\n  pve1:\n    address: x\n    containers:\n      200: {gpus: -1}\n",
                      5, "hosts.pve1.containers.200.gpus", "greater than or equal to 0"),
    "not a mapping": ("- a\n- b\n", 1, "", "must be a mapping"),
    "address like an option": ("hosts:\n  pve1:\n    address: -oProxyCommand=touch\n", 3, "hosts.pve1.address",
                               "must not start with '-'"),
    "address with a space": ("hosts:\n  pve1:\n    address: 'a b'\n", 3, "hosts.pve1.address", "spaces"),
}


def test_good_inventory_resolves_targets(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(GOOD)
    inv = load_inventory(path)
    assert [t.name for t in inv.all_targets()] == ["pve1/200", "pve1/201", "bare", "local"]
    t = inv.target("pve1/200")
    assert (t.ctid, t.gpus, t.python, t.workdir, t.host.pct) == (200, 8, "/workspace/venv/bin/python",
                                                                  "/workspace", "sudo pct")
    assert inv.target("pve1/201").workdir == "/data"
    bare = inv.target("bare")
    assert (bare.ctid, bare.gpus, bare.host.port, bare.host.user) == (None, 2, 2222, "root")
    assert inv.target("local").host.transport == "local"


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inventory_names_file_line_and_field(tmp_path: Path, case: str) -> None:
    text, line, field, words = BAD[case]
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert re.search(rf"{re.escape(str(path))}:{line}: ", message), message
    assert field in message and words in message, message


@pytest.mark.parametrize("case", ["unknown key", "duplicate container", "yaml syntax", "non-integer ctid",
                                  "superscript ctid"])
def test_cli_bad_inventory_exit_2_without_traceback(tmp_path: Path, case: str, capsys) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BAD[case][0])
    assert main(["--inventory", str(path), "doctor", "--json"]) == 2
    captured = capsys.readouterr()
    assert f"{path}:{BAD[case][1]}:" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""


def test_missing_inventory_file_is_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["--inventory", str(tmp_path / "nope.yaml"), "doctor"]) == 2
    assert "cannot read the inventory" in capsys.readouterr().err


@pytest.mark.parametrize("target, words", [
    ("pve9", "unknown host 'pve9'"),
    ("pve1", "has containers; name one: pve1/200, pve1/201"),
    ("pve1/999", "no container 999"),
    ("pve1/abc", "must be a number"),
    ("pve1/\u00b2", "must be a number (digits 0-9)"),
    ("pve1/\u2460", "must be a number (digits 0-9)"),
    ("pve1/\u0663\u0660\u0660", "must be a number (digits 0-9)"),  # int() reads it as 300
])
def test_unknown_targets(target: str, words: str) -> None:
    inv = parse_inventory(GOOD, Path("inventory.yaml"))
    with pytest.raises(TargetNotFound, match=re.escape(words)):
        inv.target(target)


def test_local_is_always_there_and_shipped_example_is_valid() -> None:
    inv = parse_inventory("hosts:\n  pve1: {address: x}\n", Path("i.yaml"))
    assert inv.target("local").host.transport == "local"
    example = load_inventory(Path(__file__).resolve().parents[3] / "inventory.yaml")
    assert [t.name for t in example.all_targets()] == ["local"]


@pytest.mark.parametrize("text, real, knock_on", [
    ("hosts:\n  pve1:\n    adress: 10.0.0.1\n", "3: hosts.pve1.adress: unknown key 'adress' (did you mean 'address'?)",
     "needs an address"),
    ("hosts:\n  pve1:\n    transport: locl\n", "3: hosts.pve1.transport: Input should be 'ssh' or 'local'",
     "needs an address"),
    ("hosts:\n  pve1:\n    transport: locl\n    address: x\n    containers: {200: {}}\n",
     "3: hosts.pve1.transport:", "containers"),
])
def test_the_real_mistake_is_reported_alone(tmp_path: Path, text: str, real: str, knock_on: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}:{real}" or lines[0].startswith(f"{path}:{real}"), lines
    assert len(lines) == 1 and knock_on not in lines[0], lines


def test_an_unrelated_unknown_key_does_not_hide_a_missing_address(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  pve1:\n    gpuz: 1\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    lines = str(info.value).splitlines()
    assert "unknown key 'gpuz'" in lines[0] and "needs an address" in lines[1]


def test_a_glob_matches_targets_by_their_name_or_their_hosts_in_the_inventorys_order(tmp_path: Path) -> None:
    inv = parse_inventory(GOOD, tmp_path / "inventory.yaml")
    names = lambda pattern: [t.name for t in inv.matching(pattern)]  # noqa: E731
    assert names("pve1") == names("pve1/*") == names("pve*") == ["pve1/200", "pve1/201"]
    assert names("*/20[1-9]") == ["pve1/201"] and names("b?re") == ["bare"]
    assert names("*") == ["pve1/200", "pve1/201", "bare", "local"]
    with pytest.raises(TargetNotFound, match=r"no target matches 'PVE\*'; targets in .*: pve1/200, pve1/201, bare"):
        inv.matching("PVE*")  # case counts, as in a TARGET
