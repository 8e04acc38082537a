"""The lab's fake nvidia-smi answers byte for byte like the real one (tests/lab/fixtures/nvidia-smi/)."""

from __future__ import annotations

import json
import queue
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.lab import FIXTURES, HERE, Lab, seed_8gpu_state
from tests.polling import wait_for

REAL = FIXTURES / "nvidia-smi"
SEED_QUERY = ["--query-gpu=index,memory.used,utilization.gpu"]
FULL_QUERY = ["--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,utilization.memory,"
              "temperature.gpu,power.draw,clocks.sm", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader"]

# The four captured states, as the fixture README describes them.
STATES = {
    "idle": {"memory.used": 0, "utilization.gpu": 0, "utilization.memory": 0, "temperature.gpu": 37,
             "power.draw": 123.71, "clocks.sm": 1980},
    "held": {"memory.used": 19603, "utilization.gpu": 0, "utilization.memory": 0, "temperature.gpu": 37,
             "power.draw": 119.97, "clocks.sm": 1980},
    "busy": {"memory.used": 1139, "utilization.gpu": 100, "utilization.memory": 25, "temperature.gpu": 60,
             "power.draw": 691.52, "clocks.sm": 1470},
    "afterkill": {"memory.used": 0, "utilization.gpu": 0, "utilization.memory": 0, "temperature.gpu": 37,
                  "power.draw": 113.62, "clocks.sm": 465},
}
PROCESSES = {"held": [{"pid": 431, "process_name": "python3", "used_memory": 19594}],
             "busy": [{"pid": 478, "process_name": "python3", "used_memory": 1130}]}
# The tables were captured a few seconds apart from the CSV queries: their own time and power reading.
TABLE_MOMENT = {"idle": ("Mon Nov 30 23:42:45 2026", 123.71), "held": ("Mon Nov 30 23:42:57 2026", 119.97),
                "busy": ("Mon Nov 30 23:43:22 2026", 690.2), "afterkill": ("Mon Nov 30 23:43:48 2026", 111.4)}


class FakeSmi:
    """The fake installed in a lab-style directory (bin/, share/, gpus.json), run without any container."""

    def __init__(self, lab_dir: Path) -> None:
        (lab_dir / "bin").mkdir(parents=True)
        (lab_dir / "share").mkdir()
        shutil.copy(HERE / "fake_nvidia_smi.py", lab_dir / "bin" / "nvidia-smi")
        shutil.copy(REAL / "help_query_gpu.txt", lab_dir / "share")
        self.state_file = lab_dir / "gpus.json"
        self.binary = lab_dir / "bin" / "nvidia-smi"

    def set(self, gpus: list[dict], **extra: object) -> None:
        self.state_file.write_text(json.dumps({"gpus": gpus, **extra}))

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(self.binary), *args], capture_output=True, text=True,
                              timeout=10)


@pytest.fixture
def smi(tmp_path: Path) -> FakeSmi:
    return FakeSmi(tmp_path / "opt-lab")


@pytest.mark.parametrize("state", sorted(STATES))
def test_queries_match_the_real_output(smi: FakeSmi, state: str) -> None:
    smi.set([STATES[state]], processes=PROCESSES.get(state, []))
    expected = {
        "seed_query.csv": [*SEED_QUERY, "--format=csv,noheader"],
        "seed_query_header.csv": [*SEED_QUERY, "--format=csv"],
        "full_nounits.csv": FULL_QUERY,
        "compute_apps.csv": APPS_QUERY,
    }
    for suffix, args in expected.items():
        result = smi(*args)
        assert result.returncode == 0
        assert result.stdout == (REAL / f"{state}_{suffix}").read_text(), suffix


@pytest.mark.parametrize("state", sorted(STATES))
def test_table_matches_the_real_output(smi: FakeSmi, state: str) -> None:
    moment, power = TABLE_MOMENT[state]
    smi.set([{**STATES[state], "power.draw": power}], processes=PROCESSES.get(state, []), timestamp=moment)
    assert smi().stdout == (REAL / f"{state}_table.txt").read_text()


def test_version_list_and_errors(smi: FakeSmi) -> None:
    no_driver = smi("--query-gpu=index", "--format=csv")
    assert no_driver.returncode == 9 and "couldn't communicate with the NVIDIA driver" in no_driver.stdout
    smi.set([{}, {"memory.used": 5}])
    assert smi("--version").stdout == (REAL / "version.txt").read_text()
    assert smi("-L").stdout.splitlines() == [
        "GPU 0: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-444444444444)",
        "GPU 1: NVIDIA H200 (UUID: GPU-00000000-1111-2222-3333-444444444445)",
    ]
    bad = smi("--query-gpu=index,gpu_temperature", "--format=csv")
    assert (bad.returncode, bad.stdout) == (2, 'Field "gpu_temperature" is not a valid field to query.\n\n')
    assert smi("--query-gpu", "memory.free,fan.speed", "--format", "csv,noheader", "-i", "1").stdout == \
        "143150 MiB, [N/A]\n"
    assert smi("--query-gpu=gpu_name,clocks.sm", "--format=csv").stdout.splitlines()[0] == \
        "name, clocks.current.sm [MHz]"
    assert smi("-L", "-i", "5").returncode == 6


def test_table_has_one_block_per_gpu(smi: FakeSmi) -> None:
    smi.set(seed_8gpu_state())
    table = smi().stdout.splitlines()
    assert sum("NVIDIA H200" in line for line in table) == 8
    assert "|   7  NVIDIA H200" in "\n".join(table) and "47421MiB / 143771MiB" in table[8 + 4 * 7 + 1]
    assert "No running processes found" in table[-2]


# ---- inside the lab's containers ------------------------------------------------------------------------

def ssh_pct_argv(lab: Lab, host: str, ctid: int, *argv: str) -> list[str]:
    return [*lab.ssh_argv(host), shlex.join([lab.hosts[host].pct_command, "exec", str(ctid), "--", *argv])]


@pytest.fixture
def ct300_gpus(lab: Lab) -> Iterator[Lab]:
    lab.set_gpus("pve2", 300, [{}])  # the session's default, one idle H200, whatever a test before left
    yield lab
    lab.set_gpus("pve2", 300, [{}])


def test_seed_state_through_ssh_and_pct(lab: Lab) -> None:
    argv = ssh_pct_argv(lab, "pve1", 200, "nvidia-smi", *SEED_QUERY, "--format=csv,noheader")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (FIXTURES / "seed_nvidia_smi_8gpu.csv").read_text()
    assert lab.ct_run("pve1", 200, ["nvidia-smi", *APPS_QUERY]).stdout == b""


def line_reader(stream) -> queue.Queue[str]:
    """Lines of a pipe, read by a thread, so that a test waits on them with a timeout."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in iter(stream.readline, "")], daemon=True).start()
    return lines


def test_loop_follows_set_gpus(ct300_gpus: Lab) -> None:
    lab = ct300_gpus
    argv = ssh_pct_argv(lab, "pve2", 300, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader",
                        "-l", "1")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as proc:
        try:
            lines = line_reader(proc.stdout)
            assert lines.get(timeout=10) == "0, 0 MiB\n"
            lab.set_gpus("pve2", 300, [{"memory.used": 4242}])
            samples = [lines.get(timeout=5), lines.get(timeout=5)]  # one may predate set_gpus
            assert samples[-1] == "0, 4242 MiB\n" and set(samples) <= {"0, 0 MiB\n", "0, 4242 MiB\n"}
        finally:
            proc.kill()
    # With the SSH client gone, the loop dies of SIGPIPE at its next sample.
    assert_eventually_gone(lab, "nvidia-smi")


def assert_eventually_gone(lab: Lab, needle: str) -> None:
    wait_for(lambda: not any(needle in " ".join(p.cmdline) for p in lab.ct_processes("pve2", 300)), 5, 0.1,
             what=f"{needle} gone from CT 300")


def test_cleared_state_reads_as_missing_driver(ct300_gpus: Lab) -> None:
    ct300_gpus.clear_gpus("pve2", 300)
    result = ct300_gpus.ct_run("pve2", 300, ["nvidia-smi"])
    assert result.returncode == 9 and result.stdout.startswith(b"NVIDIA-SMI has failed")
