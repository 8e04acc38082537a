"""A fleet rather than a handful (issue 47): a host with more containers than its sshd allows sessions on one
connection, a controller short of file descriptors, a kill that asks only where its run lives, and a bounded
`watch --once`."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.lab import ContainerSpec, HostSpec, Lab
from tests.lab.workloads import run_cli as cli

pytestmark = pytest.mark.lab
MANY = tuple(range(400, 412))  # 12 containers on one host...
MAX_SESSIONS = 10              # ...whose sshd allows OpenSSH's default of 10 sessions per connection


@pytest.fixture(scope="module")
def fleet(lab: Lab, tmp_path_factory: pytest.TempPathFactory):
    """A lab of its own: `many` with 12 running containers and MaxSessions 10, `other` with one container.
    (`lab` first: the session's lab is the one that reaps what a killed test session left behind.)"""
    root = tmp_path_factory.mktemp("fleet")
    spec = (HostSpec("many", tuple(ContainerSpec(ct) for ct in MANY), max_sessions=MAX_SESSIONS),
            HostSpec("other", (ContainerSpec(500),)))
    with Lab.start(root / "lab", spec) as instance:
        yield instance, str(instance.write_inventory(root / "inventory.yaml"))


def test_more_containers_than_the_hosts_max_sessions_all_answer(fleet, capsys, caplog) -> None:
    """Each container's watch stream holds a channel; the 11th is refused by sshd (MaxSessions 10). That refusal
    must cost no other stream its channel: every one of the 12 answers."""
    _, inv = fleet
    targets = [f"many/{ct}" for ct in MANY]
    code, snapshot, err = cli(inv, "watch", *targets, "--once", "--json", "--timeout", "60", capsys=capsys)
    assert isinstance(snapshot, dict), err
    assert snapshot["errors"] == {} and code == 0, snapshot["errors"]
    assert [(h["name"], h["connected"]) for h in snapshot["hosts"]] == [("many", True)]
    said = [r.getMessage() for r in caplog.records if "sessions per connection" in r.getMessage()]
    assert len(said) == 1 and "MaxSessions" in said[0]  # the limit it met is said, once
