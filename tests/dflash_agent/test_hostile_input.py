"""Hostile run ids, names, targets, env values and command arguments: refused or run literally, never as shell."""
from __future__ import annotations

import os

import pytest

from tests.dflash_agent.pidns import launch

HOSTILE_IDS = ["'; rm -rf /tmp/x; '", "$(touch {pwned})", "`touch {pwned}`", "a\nb", "ok\n", "../x", "..", ".hidden",
               "a/b", "", "x" * 65, "-rf", "a b"]


@pytest.fixture
def pwned(tmp_path):
    return str(tmp_path / "pwned")


@pytest.mark.parametrize("field", ["--run-id", "--name"])
def test_hostile_ids_and_names_are_refused_before_anything_is_created(container, runs_dir, pwned, field):
    for value in HOSTILE_IDS:
        value = value.format(pwned=pwned)
        args = {"--run-id": "good", "--name": "good"}
        args[field] = value
        status, out = container.agent("launch", "--runs-dir", runs_dir, "--run-id", args["--run-id"], "--name",
                                      args["--name"], "--target", "t", "--", "true")
        assert (status, out["ok"]) == (2, False), value
        assert out["code"] in ("bad_run_id", "bad_name", "bad_usage"), out
    assert not os.path.exists(runs_dir) and not os.path.exists(pwned)


def test_hostile_ids_given_to_kill_and_ps_are_refused(container, runs_dir, pwned):
    for value in HOSTILE_IDS[:6]:
        for command in ("kill", "ps"):
            status, out = container.agent(command, "--runs-dir", runs_dir, "--run-id", value.format(pwned=pwned))
            assert status == 2 and out["code"] in ("bad_run_id", "bad_usage"), (command, value, out)
    assert not os.path.exists(pwned)


def test_hostile_arguments_env_and_target_run_literally(container, runs_dir, tmp_path, pwned):
    sentinel = tmp_path / "x"
    sentinel.mkdir()
    (sentinel / "keep").write_text("keep")
    hostile = ["'; rm -rf {}; '".format(sentinel), "$(touch {})".format(pwned), "`touch {}`".format(pwned),
               "line1\nline2", "; touch {} ;".format(pwned), "--", "*"]
    script = 'for a in "$@"; do printf "[%s]\\n" "$a"; done; printf "env=[%s]\\n" "$X"; sleep 60'
    target = "$(touch {})".format(pwned)
    status, out = launch(container, runs_dir, "lit", ["sh", "-c", script, "sh"] + hostile, "--target", target,
                         "--env", "X=$(touch {}); `id`".format(pwned))
    assert status == 0, out
    assert out["run"]["target"] == target and out["run"]["command"][4:] == hostile
    with open(out["run"]["log_path"]) as handle:
        log = handle.read()
    for arg in hostile:
        assert "[{}]".format(arg) in log
    assert "env=[$(touch {}); `id`]".format(pwned) in log
    status, out = container.agent("kill", "--runs-dir", runs_dir, "--run-id", "lit", "--grace", "1")
    assert status == 0
    assert (sentinel / "keep").read_text() == "keep" and not os.path.exists(pwned)


def test_bad_targets_env_and_gpus_are_refused(container, runs_dir):
    cases = [("--target", "a\nb", "bad_target"), ("--env", "1X=y", "bad_env"), ("--env", "NOEQUALS", "bad_env"),
             ("--env", "DFLASH_RUN_ID=other", "bad_env"), ("--gpus", "0,0", "bad_gpus"), ("--gpus", "a", "bad_gpus"),
             ("--gpus", "-1", "bad_gpus"), ("--cwd", "/no/such/dir", "bad_cwd")]
    for option, value, code in cases:
        status, out = launch(container, runs_dir, "r", ["true"], option, value)
        assert (status, out["code"]) == (2, code), (option, value, out)
    assert not os.path.exists(os.path.join(runs_dir, "r"))


def test_gpu_indices_are_ascii_digits_only(container, runs_dir):
    # int() reads '٣' as 3 and ' 1' as 1: a GPU index the agent takes is ASCII digits and nothing else
    for value in ("\u0663", "0,\u0661", " 1"):
        status, out = launch(container, runs_dir, "r", ["true"], "--gpus", value)
        assert (status, out["code"]) == (2, "bad_gpus"), (value, out)
    assert not os.path.exists(os.path.join(runs_dir, "r"))
