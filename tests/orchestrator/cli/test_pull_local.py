"""`dflashctl pull` on the `local` target: what it brings, what it skips, what it refuses, and bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

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
    assert not (dest / "step_20" / "training_state.pt").exists()
    assert not (dest / "step_20" / "training_state.pt.part").exists()
