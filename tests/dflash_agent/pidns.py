"""PID namespaces standing in for containers, the agent zipapp run inside them, and their fixtures.

Every agent command runs inside a PID namespace (`unshare --pid --fork --mount-proc`) entered with `nsenter`,
the way `pct exec` enters a container: the command's parent lives outside, and orphans go to the namespace's
PID 1. Killing that PID 1 at the end takes every process of the namespace with it, so nothing a test starts
outlives it. Two kinds of PID 1: one that reaps (a normal init) and one that never does (the seed's container).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from orchestrator.runs.bundle import build_zipapp
from tests.polling import wait_for  # noqa: F401  (the agent tests import it from here)

# The interpreter that runs the agent: set it to an old Python (>= 3.8) to run the whole suite against it.
AGENT_PYTHON = os.environ.get("DFLASH_AGENT_TEST_PYTHON") or sys.executable

INIT = """
import os, signal, sys, time
reap = sys.argv[1] == "reap"
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
print("ready", flush=True)
while True:
    if not reap:
        time.sleep(3600)
        continue
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.05)
"""


def host_processes_with(runs_dir: str, run_id: str | None = None) -> list:
    """Host pids of live processes whose environment names this runs dir (and run id)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/{}/environ".format(name), "rb") as handle:
                env = handle.read().split(b"\0")
            with open("/proc/{}/stat".format(name), "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z" or ("DFLASH_RUNS_DIR=" + runs_dir).encode() not in env:
            continue
        if run_id is None or ("DFLASH_RUN_ID=" + run_id).encode() in env:
            found.append(int(name))
    return found


class Namespace:
    """A PID namespace standing in for a container; `agent(...)` runs the zipapp inside it."""

    def __init__(self, pyz: str, *, reaps: bool) -> None:
        self.pyz = pyz
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INIT,
                                      "reap" if reaps else "never"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("namespace init did not start")
        self.init_pid = wait_for(self._find_init, 5)
        self.ns_link = os.readlink("/proc/{}/ns/pid".format(self.init_pid))

    def _find_init(self):
        for name in os.listdir("/proc"):
            try:
                with open("/proc/{}/stat".format(name), "rb") as handle:
                    if int(handle.read().rsplit(b")", 1)[1].split()[1]) == self.proc.pid:
                        return int(name)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def prefix(self) -> list:
        return ["nsenter", "--target", str(self.init_pid), "--pid", "--mount", "--"]

    def run(self, argv: list, *, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix() + argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, **kwargs)

    def agent(self, *args: str, python: str | None = None, timeout: float = 30, env: dict | None = None) -> tuple:
        """(exit status, the one JSON object printed on stdout)."""
        done = self.run([python or AGENT_PYTHON, self.pyz] + list(args), timeout=timeout, env=env)
        lines = done.stdout.decode().splitlines()
        assert len(lines) == 1, (done.stdout, done.stderr.decode()[-2000:])
        return done.returncode, json.loads(lines[0])

    def popen(self, argv: list, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.prefix() + argv, stdin=subprocess.DEVNULL, **kwargs)

    def zombies(self) -> list:
        found = []
        for name in os.listdir("/proc"):
            try:
                if os.readlink("/proc/{}/ns/pid".format(name)) != self.ns_link:
                    continue
                with open("/proc/{}/stat".format(name), "rb") as handle:
                    if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        found.append(int(name))
            except (OSError, ValueError):
                continue
        return found

    def stop(self) -> None:
        try:
            os.kill(self.init_pid, signal.SIGKILL)  # the kernel then kills everything in the namespace
        except OSError:
            pass
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


def _namespaces_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (PID namespaces stand in for containers)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return "needs {} (util-linux)".format(tool)
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    if done.returncode != 0:
        return "cannot create PID namespaces here: " + done.stderr.decode().strip()
    return None


@pytest.fixture(scope="session")
def agent_pyz(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("agent") / "agent.pyz"
    path.write_bytes(build_zipapp())
    return str(path)


def _namespace(agent_pyz: str, *, reaps: bool):
    reason = _namespaces_usable()
    if reason:
        pytest.skip(reason)
    ns = Namespace(agent_pyz, reaps=reaps)
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture(scope="module")
def container(agent_pyz):
    """A container whose PID 1 reaps, like one with a normal init."""
    yield from _namespace(agent_pyz, reaps=True)


@pytest.fixture(scope="module")
def bad_init_container(agent_pyz):
    """A container whose PID 1 never reaps, like the seed run's."""
    yield from _namespace(agent_pyz, reaps=False)


@pytest.fixture
def fresh_bad_init_container(agent_pyz):
    yield from _namespace(agent_pyz, reaps=False)


@pytest.fixture
def runs_dir(tmp_path) -> str:
    path = tmp_path / "runs"
    return str(path)


def launch(ns: Namespace, runs_dir: str, run_id: str, command: list, *extra: str, settle: str | None = "0.3") -> tuple:
    """Launch through the agent; settle=None keeps the agent's default verification window."""
    settle_args = ["--settle", settle] if settle is not None else []
    return ns.agent("launch", "--runs-dir", runs_dir, "--run-id", run_id, "--name", "test", "--target", "lab/100",
                    "--cwd", os.path.dirname(runs_dir), *settle_args, *extra, "--", *command)


def record(ns: Namespace, runs_dir: str, run_id: str) -> dict:
    status, out = ns.agent("ps", "--runs-dir", runs_dir, "--run-id", run_id)
    assert status == 0, out
    return out["runs"][0]


def wait_state(ns: Namespace, runs_dir: str, run_id: str, states: tuple, timeout: float = 10) -> dict:
    found = wait_for(lambda: (lambda r: r if r["state"] in states else None)(record(ns, runs_dir, run_id)),
                     timeout, interval=0.1)
    assert found, record(ns, runs_dir, run_id)
    return found
