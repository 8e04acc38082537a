"""The agent's pieces of a multi-node job: node-watch (a node that outlives its workers is ended, exits
are mirrored), netinfo (the way to an address, a free port) and the job fields of a launch."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from dflash_agent.errors import BadInput
from dflash_agent.launch import job_fields

# a parent that starts a worker, outlives it, then hangs: torchrun stuck on an unreachable store
OUTLIVES_WORKER = "import subprocess, time; subprocess.run(['sleep', '1.5']); time.sleep(60)"


def node_watch(agent_pyz: str, stall: float, code: str, timeout: float = 30) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, agent_pyz, "node-watch", f"--stall={stall:g}", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stderr, time.monotonic() - started


def test_a_node_that_outlives_its_workers_is_ended_after_the_stall(agent_pyz) -> None:
    code, err, took = node_watch(agent_pyz, 1, OUTLIVES_WORKER)
    assert code == 1 and "last worker ended" in err
    assert 2.5 <= took < 15


def test_a_node_without_workers_yet_is_left_alone(agent_pyz) -> None:
    # torchrun waiting in the rendezvous has no workers: that is not a stall
    code, _, took = node_watch(agent_pyz, 0.5, "import time; time.sleep(2); raise SystemExit(7)")
    assert code == 7 and took >= 2


@pytest.mark.parametrize("code, expected", [("raise SystemExit(0)", 0), ("raise SystemExit(3)", 3),
                                            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                                             -signal.SIGKILL)])
def test_exit_codes_and_signals_are_mirrored(agent_pyz, code: str, expected: int) -> None:
    assert node_watch(agent_pyz, 5, code)[0] == expected


def test_term_is_passed_on(agent_pyz) -> None:
    proc = subprocess.Popen([sys.executable, agent_pyz, "node-watch", "--stall=5", "--", sys.executable, "-c",
                             "import time; print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    proc.stdout.close()


def test_netinfo_names_the_local_address_interface_and_a_free_port(agent_pyz) -> None:
    done = subprocess.run([sys.executable, agent_pyz, "netinfo", "--toward", "127.0.0.1", "--free-port"],
                          capture_output=True, text=True, timeout=30)
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["address"] == "127.0.0.1" and answer["interface"] == "lo"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", answer["port"]))  # free: binding it works


def test_netinfo_of_an_unresolvable_name_is_bad_input(agent_pyz) -> None:
    done = subprocess.run([sys.executable, agent_pyz, "netinfo", "--toward", "no-such-host.invalid"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and json.loads(done.stdout)["code"] == "bad_address"


def test_job_fields_go_together_and_are_checked() -> None:
    assert job_fields(None, None, None) == {"job_id": None, "node_rank": None, "nnodes": None}
    assert job_fields("j-1", 1, 2) == {"job_id": "j-1", "node_rank": 1, "nnodes": 2}
    for args in (("j-1", None, 2), ("j-1", 2, 2), ("j-1", -1, 2), ("../x", 0, 2), ("j", 0, 0)):
        with pytest.raises(BadInput):
            job_fields(*args)
