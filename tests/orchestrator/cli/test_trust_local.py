"""What `cleanup`, `kill` and `ps` on `local` take for proof that a process or a directory is a run's: never an
environment variable anyone can set, never a bare pid in state.json, never a run directory that links out."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.lab.workloads import run_cli
from tests.polling import wait_for


def launch(inv: str, capsys, *args: str) -> dict:
    code, record, err = run_cli(inv, "launch", "local", "--json", *args, capsys=capsys)
    assert code == 0, err
    return record


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def strangers():
    """Processes of someone else, started by the test; killed and reaped afterwards."""
    started: list[subprocess.Popen] = []

    def start(*argv: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), start_new_session=True)
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_cleanup_never_ends_a_process_that_only_sets_dflash_run_id(inv, capsys, tmp_path, strangers):
    """`env DFLASH_RUN_ID=x sleep 902 &` is no run's: anyone can set a variable. With the runs directory named
    too, and the run it names a real one that has ended, cleanup still only reports it."""
    ended = launch(inv, capsys, "--name", "ended", "--", "true")
    runs = str(tmp_path / "work" / ".dflash" / "runs")
    bare = strangers("env", "DFLASH_RUN_ID=x", "sleep", "902")
    named = strangers("env", f"DFLASH_RUN_ID={ended['run_id']}", f"DFLASH_RUNS_DIR={runs}", "sleep", "903")
    assert wait_for(lambda: all(b"DFLASH_RUN_ID" in Path(f"/proc/{p.pid}/environ").read_bytes()
                                for p in (bare, named)), 5)
    for dry in (["--dry-run"], []):
        code, report, err = run_cli(inv, "cleanup", "local", *dry, "--json", capsys=capsys)
        result = report["targets"]["local"]
        assert code == 0 and result["ok"], err
        assert [a for a in result["actions"] if a.get("pid") in (bare.pid, named.pid)] == [], result["actions"]
        claims = [f for f in result["findings"] if f["kind"] == "unproven_run_processes"]
        assert len(claims) == 1 and claims[0]["pids"] == [named.pid], result["findings"]
    assert bare.poll() is None and named.poll() is None
    code, text, _ = run_cli(inv, "cleanup", "local", capsys=capsys)
    assert f"environment ({named.pid}) but nothing ties them to it: left alone" in text


def forge_supervisor(runs: Path, run_id: str, pid: int, start: int | None) -> None:
    """state.json of a run that has ended, rewritten to name `pid` as its live supervisor."""
    path = runs / run_id / "state.json"
    state = json.loads(path.read_text())
    state.update(state="running", supervisor_pid=pid, supervisor_start_time=start, supervisor_boot_id=None,
                 ended_at=None, signal=None, exit_code=None)
    path.write_text(json.dumps(state))


@pytest.mark.parametrize("recorded_start", ["none", "right"])
def test_kill_and_ps_never_take_a_stranger_named_in_state_json_for_the_supervisor(inv, capsys, tmp_path,
                                                                               strangers, recorded_start):
    run = launch(inv, capsys, "--name", "victim", "--", "true")
    stranger = strangers("sleep", "904")
    assert wait_for(lambda: Path(f"/proc/{stranger.pid}/cmdline").read_bytes().startswith(b"sleep"), 5)
    start = start_time(stranger.pid) if recorded_start == "right" else None
    runs = tmp_path / "work" / ".dflash" / "runs"
    forge_supervisor(runs, run["run_id"], stranger.pid, start)
    code, report, err = run_cli(inv, "kill", run["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0, err
    result = report["targets"]["local"]["runs"][0]
    assert stranger.poll() is None  # never signalled
    assert [r["pid"] for r in result.get("refused", [])] == [stranger.pid], result
    assert result["refused"][0]["role"] == "supervisor" and result["refused"][0]["process"]["cmdline"] == "sleep 904"
    forge_supervisor(runs, run["run_id"], stranger.pid, start)
    code, text, _ = run_cli(inv, "kill", run["run_id"], "--grace", "1", capsys=capsys)
    assert f"NOT SIGNALLED: pid {stranger.pid}" in text and stranger.poll() is None
    forge_supervisor(runs, run["run_id"], stranger.pid, start)
    code, listing, err = run_cli(inv, "ps", "local", "--json", capsys=capsys)
    record = next(r for r in listing["runs"] if r["run_id"] == run["run_id"])
    assert record["state"] == "lost" and "not its supervisor" in record["error"], record
    assert stranger.poll() is None


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_run_directory_that_links_out_of_the_workdir_is_skipped_and_reported(inv, capsys, tmp_path):
    real = launch(inv, capsys, "--name", "real", "--", "true")
    runs = tmp_path / "work" / ".dflash" / "runs"
    outside = tmp_path / "elsewhere" / "linked"
    outside.mkdir(parents=True)
    # a run left `running` without a supervisor: ps would settle it `lost`, writing state.json and .lock
    (outside / "run.json").write_text(json.dumps({"run_id": "linked", "name": "linked", "created_ts": 0}))
    (outside / "state.json").write_text(json.dumps({"state": "running", "run_id": "linked"}))
    os.symlink(outside, runs / "linked")
    before = tree(outside)
    code, listing, err = run_cli(inv, "ps", "local", "--all", "--json", capsys=capsys)
    assert code == 0, err
    assert tree(outside) == before  # nothing written there: no .lock, state.json untouched
    assert [r["run_id"] for r in listing["runs"]] == [real["run_id"]]
    assert f"local: {runs / 'linked'} skipped: a symbolic link out of the run tree: not followed" in err
    code, report, err = run_cli(inv, "cleanup", "local", "--json", capsys=capsys)
    result = report["targets"]["local"]
    assert code == 0, err
    skipped = [f for f in result["findings"] if f["kind"] == "run_dir_not_followed"]
    assert [(f["run_id"], f["points_to"]) for f in skipped] == [("linked", str(outside))], result["findings"]
    assert tree(outside) == before  # nothing written there: no .lock, state.json untouched
    assert sorted(os.listdir(outside)) == ["run.json", "state.json"]
