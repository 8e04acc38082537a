"""The local cache of where runs live: updates from many threads and commands at once keep every run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from dflash_records.run import RunRecord
from orchestrator.runs import whereabouts
from tests.trainer.conftest import REPO_ROOT

THREADS, EACH = 8, 10

# What a `launch --each` does: a thread per target, each noting its run the moment its launch answers.
REMEMBER_FROM_THREADS = f"""
import sys, threading
from dflash_records.run import RunRecord
from orchestrator.runs import whereabouts

def note(tag):
    for i in range({EACH}):
        whereabouts.remember([("t-" + tag, RunRecord(run_id="r-%s-%d" % (tag, i)))])

threads = [threading.Thread(target=note, args=(sys.argv[1] + str(t),)) for t in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def test_runs_noted_by_many_threads_of_two_commands_at_once_are_all_kept(tmp_path, monkeypatch):
    """Each update read the file, added its run and wrote the file back: two commands of 8 threads kept about
    one run in ten. Every one must be kept, where it was seen."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    commands = [subprocess.Popen([sys.executable, "-c", REMEMBER_FROM_THREADS, tag], env=env) for tag in "ab"]
    assert [command.wait(timeout=120) for command in commands] == [0, 0]
    cached = json.loads(whereabouts.cache_path().read_text())
    expected = {f"r-{p}{t}-{i}": [f"t-{p}{t}"] for p in "ab" for t in range(THREADS) for i in range(EACH)}
    assert {k: v for k, v in cached.items() if k in expected} == expected, f"{len(cached)} of {len(expected)}"
    assert whereabouts.places(["r-a0-0", "r-b7-9"]) == {"r-a0-0": ["t-a0"], "r-b7-9": ["t-b7"]}


def test_threads_of_one_command_keep_every_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))

    def note(tag: str) -> None:
        for i in range(EACH):
            whereabouts.remember([(tag, RunRecord(run_id=f"{tag}-{i}"))])

    threads = [threading.Thread(target=note, args=(f"t{n}",)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(json.loads(whereabouts.cache_path().read_text())) == THREADS * EACH
