"""`dflashctl pull` on the `local` target: what it brings, what it skips, what it refuses, and bad input."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.pull import BarProgress
from orchestrator.runs.fetch import RemoteFile, Step
from tests.lab.workloads import link_outputs_argv, run_cli, write_checkpoint_dir

STATE = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def run_with_outputs(inv, tmp_path, capsys):
    """A finished run whose output_dir holds step_10 and step_20 (manifests included), metrics and a log."""
    out = tmp_path / "out"
    write_checkpoint_dir(out / "step_10", {"model.safetensors": b"w10" * 1000, "training_state.pt": STATE[:5000]})
    write_checkpoint_dir(out / "step_20", {"model.safetensors": b"w20" * 1000, "training_state.pt": STATE})
    (out / "metrics.jsonl").write_text('{"event": "step", "step": 20}\n')
    code, record, err = run_cli(inv, "launch", "local", "--name", "drafter", "--gpus", "none", "--json", "--",
                                *link_outputs_argv(str(out)), capsys=capsys)
    assert code == 0, err
    return record


def test_pull_brings_the_newest_checkpoint_metrics_and_log_verified(inv, run_with_outputs, tmp_path, capsys):
    dest = tmp_path / "pulled"
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    assert result["checkpoints"] == ["step_20"]
    assert sorted(f["path"] for f in result["files"]) == [
        "metrics.jsonl", "step_20/manifest.json", "step_20/model.safetensors", "step_20/training_state.pt",
        "train.log"]
    assert (dest / "step_20" / "training_state.pt").read_bytes() == STATE
    assert "outputs in" in (dest / "train.log").read_text()
    assert not list(dest.rglob("*.part"))
    # again: everything is here and verified, nothing travels
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0 and result["bytes_transferred"] == 0
    assert {f["action"] for f in result["files"]} == {"skip"}


def test_all_and_a_named_step(inv, run_with_outputs, tmp_path, capsys):
    code, result, err = run_cli(inv, "pull", "drafter", "--checkpoint", "all", "--to", str(tmp_path / "a"),
                                "--json", capsys=capsys)
    assert code == 0, err
    assert result["checkpoints"] == ["step_10", "step_20"]
    assert (tmp_path / "a" / "step_10" / "model.safetensors").read_bytes() == b"w10" * 1000
    code, result, err = run_cli(inv, "pull", "drafter", "-c", "step_10", "--to", str(tmp_path / "b"), "--json",
                                capsys=capsys)
    assert code == 0 and result["checkpoints"] == ["step_10"] and not (tmp_path / "b" / "step_20").exists()


def test_a_different_local_file_is_never_replaced_without_force(inv, run_with_outputs, tmp_path, capsys):
    dest = tmp_path / "pulled"
    mine = dest / "step_20" / "model.safetensors"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"my own edits")
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(dest), capsys=capsys)
    assert code == 1 and "refusing to overwrite" in err and "--force" in err and str(mine) in err
    assert mine.read_bytes() == b"my own edits" and not (dest / "train.log").exists()  # nothing transferred
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--force", capsys=capsys)
    assert code == 0, err
    assert mine.read_bytes() == b"w20" * 1000


def test_a_partial_file_resumes_from_its_offset_and_a_damaged_one_is_caught(inv, run_with_outputs, tmp_path,
                                                                            capsys):
    dest = tmp_path / "pulled"
    part = dest / "step_20" / "training_state.pt.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(STATE[:300_000])
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    state = next(f for f in result["files"] if f["path"] == "step_20/training_state.pt")
    assert state["action"] == "resume" and state["resumed_from"] == 300_000
    assert (dest / "step_20" / "training_state.pt").read_bytes() == STATE and not part.exists()
    # a .part whose bytes are not the file's start: the sha256 check catches it, and it is fetched again whole
    (dest / "step_20" / "training_state.pt").unlink()
    part.write_bytes(b"x" * 300_000)
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    assert (dest / "step_20" / "training_state.pt").read_bytes() == STATE and not part.exists()
    assert result["bytes_transferred"] == (len(STATE) - 300_000) + len(STATE)  # the rest, then all of it again


def test_a_grown_log_is_extended_not_refused(inv, run_with_outputs, tmp_path, capsys):
    dest = tmp_path / "pulled"
    assert run_cli(inv, "pull", "drafter", "--to", str(dest), capsys=capsys)[0] == 0
    metrics = Path(run_with_outputs["log_path"]).parent / "metrics.jsonl"
    with open(metrics, "a") as sink:
        sink.write('{"event": "step", "step": 30}\n')
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    assert next(f for f in result["files"] if f["path"] == "metrics.jsonl")["action"] == "extend"
    assert (dest / "metrics.jsonl").read_text().splitlines()[-1] == '{"event": "step", "step": 30}'


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "step_99"], "has no complete checkpoint step_99 (it has: step_10, step_20)"),
    (["--checkpoint", "newest"], "--checkpoint 'newest': give latest, all or step_N"),
    (["--checkpoint", "all", "--export"], "--export makes one serving copy"),
])
def test_bad_input_exits_2_with_one_line(inv, run_with_outputs, tmp_path, capsys, args, message):
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(tmp_path / "x"), *args, capsys=capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_unknown_run_and_a_run_without_checkpoints_exit_2(inv, tmp_path, capsys):
    code, out, err = run_cli(inv, "pull", "nosuch", capsys=capsys)
    assert code == 2 and "no run or job 'nosuch'" in err and len(err.strip().splitlines()) == 1
    code, record, err = run_cli(inv, "launch", "local", "--name", "plain", "--gpus", "none", "--json", "--",
                                "true", capsys=capsys)
    code, out, err = run_cli(inv, "pull", "plain", "--to", str(tmp_path / "y"), capsys=capsys)
    assert code == 2 and "has no complete checkpoint" in err and len(err.strip().splitlines()) == 1


def test_a_file_that_is_not_what_its_manifest_says_is_refused_after_transfer(inv, run_with_outputs, tmp_path,
                                                                             capsys):
    remote = tmp_path / "out" / "step_20" / "training_state.pt"
    damaged = bytearray(remote.read_bytes())
    damaged[12345] ^= 0xFF  # one flipped bit on the target's disk, same size
    remote.write_bytes(bytes(damaged))
    dest = tmp_path / "pulled"
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(dest), capsys=capsys)
    assert code == 1 and "sha256" in err and "training_state.pt" in err and len(err.strip().splitlines()) <= 2
    # pulling again brings the same bytes: the message says the checkpoint changed, not "pull again"
    assert "not what its checkpoint's manifest.json recorded" in err and "changed on the target" in err
    assert "pull again" not in err
    assert not (dest / "step_20" / "training_state.pt").exists()
    assert not (dest / "step_20" / "training_state.pt.part").exists()


# an OSC 52 clipboard write, an OSC 0 title, and what rich would read as a markup tag, in one file name
HOSTILE = "ev\x1b]52;c;aGk=\x07il\x1b]0;PWNED\x07[blink].bin"


def one_clean_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def ends_in_one_error_line(err: str) -> bool:
    """The progress bar, as far as it got, then one line that says why the pull stopped."""
    lines = err.strip().splitlines()
    return lines[-1].startswith("dflashctl: error: ") and "Traceback" not in err and \
        sum(line.startswith("dflashctl: ") for line in lines) == 1


def test_file_names_reach_the_terminal_as_text(inv, run_with_outputs, tmp_path, capsys):
    bar = BarProgress()  # the bar names the file in flight: a name is neither an escape nor markup there
    bar.start(10, 1)
    bar.file(Step(RemoteFile(source="/x/" + HOSTILE, dest="step_20/" + HOSTILE, size=10, sha256="0"),
                  tmp_path / "y", "fetch"))
    bar.advance(10)
    bar.done()
    err = capsys.readouterr().err
    assert "step_20/evil[blink].bin (fetch)" in err and "\x1b" not in err and "\x07" not in err
    write_checkpoint_dir(tmp_path / "out" / "step_20", {HOSTILE: b"theirs"})
    mine = tmp_path / "pulled" / "step_20" / HOSTILE
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"mine")  # in the way: the refusal names the file
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(tmp_path / "pulled"), capsys=capsys)
    assert code == 1 and one_clean_line(err) and "step_20/evil[blink].bin differs" in err
    assert "\x1b" not in err and "\x07" not in err


def test_an_output_dir_name_reaches_the_terminal_as_text(inv, tmp_path, capsys):
    out = tmp_path / HOSTILE  # the run chose where its outputs go, and saved nothing there
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    code, record, err = run_cli(inv, "launch", "local", "--name", "nosave", "--gpus", "none", "--json", "--",
                                *link_outputs_argv(str(out)), capsys=capsys)
    assert code == 0, err
    code, out, err = run_cli(inv, "pull", "nosave", "--to", str(tmp_path / "x"), capsys=capsys)
    assert code == 2 and one_clean_line(err) and "has no complete checkpoint in" in err and "evil[blink].bin" in err
    assert "\x1b" not in err and "\x07" not in err


def test_symbolic_links_are_not_followed_and_said(inv, run_with_outputs, tmp_path, capsys):
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$secret")
    out = tmp_path / "out"
    os.symlink(secret, out / "step_20" / "shadow")  # a link in the checkpoint
    write_checkpoint_dir(tmp_path / "elsewhere", {"model.safetensors": b"not this run's"})
    os.symlink(tmp_path / "elsewhere", out / "step_30")  # a linked, newer checkpoint
    os.symlink(secret, Path(run_with_outputs["log_path"]).parent / "config.yaml")  # a linked run file
    dest = tmp_path / "pulled"
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(dest), "--json", capsys=capsys)
    assert code == 0, err
    assert result["checkpoints"] == ["step_20"]
    assert sorted(s["dest"] for s in result["skipped"]) == ["config.yaml", "step_20/shadow", "step_30/"]
    assert all(s["reason"] == "a symbolic link: not followed" for s in result["skipped"])
    assert err.count("dflashctl: warning: local:") == 3 and f"{out}/step_20/shadow skipped" in err
    assert f"it points to {secret}" in err
    pulled = [p for p in dest.rglob("*") if p.is_file()]
    assert pulled and not [p for p in pulled if b"secret" in p.read_bytes() or b"this run's" in p.read_bytes()]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real tmpfs of 256 KiB: a pull of the 1 MiB training state fills it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_ends_the_pull_in_one_line_and_the_next_resumes(inv, run_with_outputs, small_disk, capsys):
    part = small_disk / "step_20" / "training_state.pt.part"
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(small_disk), capsys=capsys)
    assert code == 1 and ends_in_one_error_line(err) and "No space left on device" in err, err
    kept = part.stat().st_size
    assert 0 < kept < len(STATE) and f"{part}: No space left on device; {kept} of its {len(STATE)} bytes are kept" \
        in err
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # room made
    code, result, err = run_cli(inv, "pull", "drafter", "--to", str(small_disk), "--json", capsys=capsys)
    assert code == 0, err
    state = next(f for f in result["files"] if f["path"] == "step_20/training_state.pt")
    assert state["action"] == "resume" and state["resumed_from"] == kept
    assert (small_disk / "step_20" / "training_state.pt").read_bytes() == STATE and not part.exists()


def test_a_file_size_limit_ends_the_pull_in_one_line(inv, run_with_outputs, tmp_path):
    limit = 300_000

    def under_ulimit_f() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    dest = tmp_path / "pulled"
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", "orchestrator", "--inventory", inv, "pull", "drafter", "--to",
                           str(dest)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)},
                          preexec_fn=under_ulimit_f, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and ends_in_one_error_line(done.stderr) and "File too large" in done.stderr, \
        done.stderr
    assert (dest / "step_20" / "training_state.pt.part").stat().st_size == limit


@pytest.mark.parametrize("where, why", [("afile/sub", "Not a directory"), ("/proc/nope", "No such file")])
def test_a_destination_that_cannot_be_a_directory_exits_2(inv, run_with_outputs, tmp_path, capsys, where, why):
    (tmp_path / "afile").write_text("a file")
    code, out, err = run_cli(inv, "pull", "drafter", "--to", where if where.startswith("/") else
                             str(tmp_path / where), capsys=capsys)
    assert code == 2 and one_clean_line(err) and "cannot make this directory" in err and why in err, err


def test_a_run_still_starting_has_no_checkpoint_yet(inv, tmp_path, capsys):
    code, record, err = run_cli(inv, "launch", "local", "--name", "early", "--gpus", "none", "--json", "--",
                                "sleep", "60", capsys=capsys)
    assert code == 0, err
    try:
        code, out, err = run_cli(inv, "pull", "early", "--to", str(tmp_path / "x"), capsys=capsys)
        assert code == 2 and one_clean_line(err) and "has no checkpoint yet" in err and "still running" in err
        assert "not the bundled trainer" not in err
    finally:
        assert run_cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)[0] == 0


def test_files_already_here_show_no_rate(inv, run_with_outputs, tmp_path, capsys):
    dest = tmp_path / "pulled"
    assert run_cli(inv, "pull", "drafter", "--to", str(dest), capsys=capsys)[0] == 0
    code, out, err = run_cli(inv, "pull", "drafter", "--to", str(dest), capsys=capsys)
    assert code == 0 and "0 file(s) fetched, 5 already here" in out
    assert "/s" not in err and "(skip)" not in err
