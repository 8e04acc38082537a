"""Shared fixtures. `lab`: the fake Proxmox lab (tests/lab/lab.py), one per test session."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

# One CPU thread for torch in every test process and every process a test starts, before anything imports torch:
# the suite runs two workers on two cores, and torch's default (a thread per core in each process) made a
# worker's in-process fixtures (the tiny target answering prompts) 4x slower under that load.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
# The agent's boot unit (dflash_agent/bootunit.py) goes into /etc/systemd/system where systemd booted the machine:
# an agent a test runs here looks under a root that does not exist instead (a test that wants one passes its own).
os.environ.setdefault("DFLASH_SYSTEMD_ROOT", os.path.join(tempfile.gettempdir(), "dflashctl-tests-no-systemd"))

# SIGINT and SIGHUP as a terminal session has them, whatever started the suite: an ignored signal is inherited
# across exec, and a suite started by nohup or as a background job (`&` without job control) handed that to every
# CLI, pct and workload a test starts, so the tests that send those signals failed there and nowhere else.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

import pytest

from tests.lab.lab import Lab, lab_unavailable_reason
from tests.lab.lxclab import lxc_spec, lxc_unavailable_reason


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that uses the lab carries the `lab` marker, so `-m "not lab"` deselects them all.
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)


@pytest.fixture(autouse=True)
def _machine_turn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked `loads_machine` drives the whole machine's load up on purpose (forty clients beside
    spinners): under pytest-xdist it runs only while no other worker runs a test, and no other test starts until
    it is done. Launch and timing tests beside it once saw 10 s stalls that were its doing, not theirs."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    # the workers' base temporary directories sit side by side in one directory of the session
    with _turn(tmp_path_factory.getbasetemp().parent, alone=request.node.get_closest_marker("loads_machine")
               is not None):
        yield


@contextlib.contextmanager
def _turn(shared: Path, *, alone: bool) -> Iterator[None]:
    """Readers and a writer with the writer first: the gate stops new tests once a loading test waits for the
    running ones to finish (flock alone would let two workers' back-to-back tests starve it)."""
    gate = os.open(shared / "machine-turn.gate", os.O_RDWR | os.O_CREAT, 0o600)
    held = os.open(shared / "machine-turn.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(held, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(held, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(held)  # closing a descriptor releases its lock
        os.close(gate)


def _interrupt_on_sigterm(signum: int, _frame: object) -> None:
    # pytest stops the session on KeyboardInterrupt and still tears the fixtures down.
    raise KeyboardInterrupt(f"terminated by signal {signum}")


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The fake Proxmox lab: hosts pve1 (CT 200 running with 8 GPUs, CT 201 stopped) and pve2 (CT 300
    running, 1 GPU), real sshd on each. Torn down at the end of the session, on failure, on Ctrl-C and
    SIGTERM, and at interpreter exit as a last resort (Lab.start registers an atexit handler).
    Skipped where the lab cannot run (not root, tools missing) unless DFLASHCTL_LAB_REQUIRED=1 (for CI)."""
    reason = lab_unavailable_reason()
    if reason and os.environ.get("DFLASHCTL_LAB_REQUIRED") == "1":
        pytest.fail(f"DFLASHCTL_LAB_REQUIRED=1 but {reason}")
    if reason:
        pytest.skip(reason)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    instance = Lab.start(tmp_path_factory.mktemp("lab"))
    try:
        yield instance
    finally:
        instance.stop()
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session")
def lxc_lab() -> Iterator[Lab]:
    """The lab with real, unprivileged LXC containers (tests/lab/lxclab.py): pve1 with CT 200 (8 GPUs, a PID 1
    that never reaps, pct exec --keep-env) and CT 202 (a reaping PID 1, 192 MiB of memory), pve2 with CT 300
    (1 GPU, pct exec --clear-env). Its root is a directory of its own (container roots must be reachable by the
    containers' mapped root, which the session's 0700 temporary directory is not). Skipped like `lab`."""
    reason = lab_unavailable_reason() or lxc_unavailable_reason()
    if reason and os.environ.get("DFLASHCTL_LAB_REQUIRED") == "1":
        pytest.fail(f"DFLASHCTL_LAB_REQUIRED=1 but {reason}")
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="dflashctl-lxclab-"))
    root.chmod(0o711)
    instance = Lab.start(root, lxc_spec(), lxc=True)
    try:
        yield instance
    finally:
        instance.stop()
        shutil.rmtree(root, ignore_errors=True)
