"""One answer of every kind from a real agent zipapp on this machine, for the wire tests: two runs (one that saved a
checkpoint and ended, one that lives until it is killed), then ps, lines, pull-plan, a refused relaunch, check,
netinfo, probe, kill and a cleanup dry run.

`record_answers` is also how old_agent_answers.json was made, from the agent of the version before the typed answers
(its zipapp built from that commit's tree): `python -m tests.dflash_records.wire_scenario AGENT.pyz OUT.json`.
What would name the machine that recorded it (its paths, its host name, its processes) is replaced by stand-ins.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.lab.workloads import STEP, stop_keeper

# a run that saves a complete checkpoint of the bundled trainer's shape (its output_dir found through the
# metrics.jsonl link in the run directory), prints one step line and ends
SAVED = ('o="$0/out"; mkdir -p "$o/step_1" && for f in config.json model.safetensors training_state.pt '
         'trainer_config.json; do echo x > "$o/step_1/$f"; done && echo \'{"step": 1}\' > "$o/metrics.jsonl" && '
         'ln -s "$o/metrics.jsonl" "$DFLASH_RUN_DIR/metrics.jsonl" && echo "$1"')
LIVE = 'echo "$0"; exec sleep 60'
WORKDIR, HOSTNAME, PYTHON = "/workspace", "ct200", "python3"


def ask(agent: str, *args: str, stdin: bytes = b"") -> dict:
    """One agent subcommand's answer (its last line of JSON)."""
    done = subprocess.run([sys.executable, agent, *args], input=stdin, capture_output=True, timeout=60)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def record_answers(agent: str, workdir: Path) -> dict[str, dict]:
    runs = str(workdir / "runs")
    step = STEP.format(i=1)
    launch = ["launch", "--runs-dir", runs, "--name", "wire", "--target", "local", "--settle", "0.3", "--gpus", "none"]
    try:
        answers = {
            "launch_ended": ask(agent, *launch, "--run-id", "saved", "--", "sh", "-c", SAVED, str(workdir), step),
            "launch": ask(agent, *launch, "--run-id", "live", "--", "sh", "-c", LIVE, step),
            "ps": ask(agent, "ps", "--runs-dir", runs, "--tail-bytes", "4096"),
            "lines": ask(agent, "lines", "--runs-dir", runs, "--run-id", "live", "--start", "0", "--stop", "5"),
            "pull_plan": ask(agent, "pull-plan", "--runs-dir", runs, "--run-id", "saved", "--have", "train.log=1"),
            "relaunch_refused": ask(agent, "relaunch", "--runs-dir", runs, "--run-id", "saved", "--new-run-id", "s2"),
            "check": ask(agent, "check", "--", sys.executable, "-c", "print('{\"ok\": true}')"),
            "netinfo": ask(agent, "netinfo", "--toward", "127.0.0.1", "--free-port"),
            "probe": ask(agent, "probe", "--workdir", str(workdir), "--runs-dir", runs, "--path", str(workdir)),
            "kill": ask(agent, "kill", "--runs-dir", runs, "--run-id", "live", "--grace", "1"),
            "cleanup": ask(agent, "cleanup", "--runs-dir", runs, "--dry-run"),
        }
    finally:
        stop_keeper(Path(runs))
    return scrub(answers, {str(workdir): WORKDIR, socket.gethostname(): HOSTNAME, sys.executable: PYTHON})


def scrub(value, stand_ins: dict[str, str]):
    """`value` with every text of this machine replaced by its stand-in, and the processes of others (a cleanup
    lists every zombie it sees) left out."""
    if isinstance(value, dict):
        return {scrub(key, stand_ins): [] if key in ("foreign_zombies", "findings") else scrub(item, stand_ins)
                for key, item in value.items()}
    if isinstance(value, list):
        return [scrub(item, stand_ins) for item in value]
    if isinstance(value, str):
        for text, stand_in in stand_ins.items():
            value = value.replace(text, stand_in)
    return value


def shape(value) -> object:
    """The keys and value types of a JSON value, all the way down: what must not be renamed, dropped or retyped.
    A list's shape is its items' shapes merged, whatever its length ([None] when empty: no item to say); a null
    says no type (None)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        merged = None
        for item in value:
            merged = merge_shapes(merged, shape(item))
        return [merged]
    if value is None:
        return None
    return frozenset({"bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float))
                      else type(value).__name__})


def merge_shapes(one, other) -> object:
    """One shape that both hold (the shape of a list holding an item of each)."""
    if one is None or other is None:
        return other if one is None else one
    if isinstance(one, dict) and isinstance(other, dict):
        return {key: merge_shapes(one.get(key), other.get(key)) for key in {**one, **other}}
    if isinstance(one, list) and isinstance(other, list):
        return [merge_shapes(one[0], other[0])]
    if isinstance(one, frozenset) and isinstance(other, frozenset):
        return one | other
    return frozenset({"mixed"})  # a container beside a scalar: no answer of ours does that


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        found = record_answers(sys.argv[1], Path(tmp))
    Path(sys.argv[2]).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
