"""The agent's `packages`: a trainer package arrives whole or leaves nothing (no temp dir, no zombie, even under
a PID 1 that never reaps), and only versions that no live run uses and nobody asked for lately are removed."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

from orchestrator.runs.deploy import trainer_bundle
from tests.dflash_agent.pidns import AGENT_PYTHON, Namespace, launch


def packages(ns, pkg_dir: str, runs_dir: str, *, send: bytes | None = None, size: int | None = None,
             stall: float = 30.0) -> tuple:
    """(exit status, answer) of `packages`; `send` is what arrives on stdin, `size` what was announced."""
    data = trainer_bundle().data
    args = ["packages", "--dir", pkg_dir, "--runs-dir", runs_dir]
    if send is not None:
        args += ["--size", str(len(data) if size is None else size), "--sha256", hashlib.sha256(data).hexdigest(),
                 "--stall", str(stall)]
    done = subprocess.run(ns.prefix() + [AGENT_PYTHON, ns.pyz, *args], input=send or b"", capture_output=True,
                          timeout=60)
    return done.returncode, json.loads(done.stdout.decode().splitlines()[-1])


def test_a_package_is_installed_whole_once(container, tmp_path):
    pkg = tmp_path / "pkg" / trainer_bundle().digest
    status, out = packages(container, str(pkg), str(tmp_path / "runs"), send=trainer_bundle().data)
    assert (status, out["installed"]) == (0, True), out
    assert (pkg / "trainer" / "config.py").is_file() and os.listdir(tmp_path / "pkg") == [pkg.name]
    status, out = packages(container, str(pkg), str(tmp_path / "runs"), send=trainer_bundle().data)
    assert (status, out["installed"], os.listdir(tmp_path / "pkg")) == (0, False, [pkg.name])  # a racing twin


def test_a_cut_or_damaged_upload_leaves_no_temp_dir_and_no_zombie(bad_init_container, tmp_path):
    data, pkg = trainer_bundle().data, tmp_path / "pkg" / trainer_bundle().digest
    zombies = set(bad_init_container.zombies())
    cases = [(data[: len(data) // 2], "upload_cut"), (data[:-1] + bytes([data[-1] ^ 1]), "upload_damaged"),
             (data + b"x", "upload_cut")]
    for sent, code in cases:
        status, out = packages(bad_init_container, str(pkg), str(tmp_path / "runs"), send=sent, size=len(data))
        assert (status, out["code"]) == (1, code), out
        assert not (tmp_path / "pkg").exists() or os.listdir(tmp_path / "pkg") == []
    assert set(bad_init_container.zombies()) == zombies


def test_a_receiver_whose_sender_went_silent_gives_up_after_the_stall(bad_init_container, tmp_path):
    data, pkg = trainer_bundle().data, tmp_path / "pkg" / trainer_bundle().digest
    receiver = subprocess.Popen(bad_init_container.prefix() + [
        AGENT_PYTHON, bad_init_container.pyz, "packages", "--dir", str(pkg), "--runs-dir", str(tmp_path / "runs"),
        "--size", str(len(data)), "--stall", "0.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    started = time.monotonic()
    receiver.stdin.write(data[:1000])
    receiver.stdin.flush()  # and then nothing, with the pipe still open: a link that went down
    try:
        receiver.wait(timeout=30)  # stdin still open: communicate() would close it, which is a cut, not a stall
    finally:
        receiver.stdin.close()
    assert json.loads(receiver.stdout.read())["code"] == "upload_stalled" and time.monotonic() - started < 10
    receiver.stdout.close()
    assert not (tmp_path / "pkg").exists() or os.listdir(tmp_path / "pkg") == []


def test_only_versions_no_live_run_uses_and_none_asked_for_lately_are_removed(container, tmp_path):
    root, runs = tmp_path / "pkg", str(tmp_path / "runs")
    names = {"old": "a" * 16, "used": "b" * 16, "fresh": "c" * 16, "dead_temp": "d" * 16 + ".tmp.{}",
             "live_temp": "e" * 16 + ".tmp.{}", "legacy_temp": "f" * 16 + ".tmp", "other": "notes"}
    ended = container.run(["sh", "-c", "echo $$"]).stdout.decode().strip()  # a receiver that is gone
    live = container.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"]).stdout.decode().strip()  # one that is not
    try:
        names["dead_temp"], names["live_temp"] = names["dead_temp"].format(ended), names["live_temp"].format(live)
        for key, name in names.items():
            (root / name / "trainer").mkdir(parents=True)
            if key not in ("fresh", "live_temp"):
                os.utime(root / name, (time.time() - 7200, time.time() - 7200))  # past the lease
        status, out = launch(container, runs, "user", ["sleep", "60"], "--pythonpath", str(root / names["used"]))
        assert status == 0, out
        status, out = packages(container, str(root / names["fresh"]), runs)
        assert status == 0, out
        assert sorted(out["removed"]) == sorted(names[k] for k in ("old", "dead_temp", "legacy_temp"))
        assert sorted(os.listdir(root)) == sorted(names[k] for k in ("used", "fresh", "live_temp", "other"))
        status, out = container.agent("kill", "--runs-dir", runs, "--run-id", "user", "--grace", "1")
        assert status == 0, out
        status, out = packages(container, str(root / names["fresh"]), runs)  # its run ended: it goes too
        assert out["removed"] == [names["used"]]
    finally:
        container.run(["kill", live])


def test_a_launch_that_leases_its_package_does_nothing_where_it_is_absent_and_prunes_where_it_is(container,
                                                                                                  tmp_path):
    """`launch --lease-pkg`: the trainer package checked and leased in the launch's own command. Absent, the
    answer says so (needs_deploy, pkg absent), its input is taken and nothing is created; present, the run starts,
    the package's lease is renewed and a version nothing uses is pruned, as `packages` would."""
    root, runs = tmp_path / "pkg", str(tmp_path / "runs")
    pkg, old = root / ("a" * 16), root / ("b" * 16)
    status, out = launch(container, runs, "early", ["sleep", "60"], "--lease-pkg", str(pkg))
    assert (out["ok"], out["code"], out["pkg"]) == (False, "needs_deploy", "absent"), out
    assert not os.path.exists(runs) or os.listdir(runs) == []
    for version in (pkg, old):
        (version / "trainer").mkdir(parents=True)
        os.utime(version, (time.time() - 7200, time.time() - 7200))  # both past the lease
    status, out = launch(container, runs, "leased", ["sleep", "60"], "--lease-pkg", str(pkg),
                         "--pythonpath", str(pkg))
    try:
        assert status == 0 and out["run"]["state"] == "running", out
        assert time.time() - os.stat(pkg).st_mtime < 60 and os.listdir(root) == [pkg.name]
    finally:
        container.agent("kill", "--runs-dir", runs, "--run-id", "leased", "--grace", "1")


def test_a_lost_runs_package_is_kept_until_it_is_relaunched(agent_pyz, container, tmp_path):
    """A run lost with its container under a restart policy may be started again by a relaunch, with the
    pythonpath it had: its package is in use until then, however old; a lost run without a policy keeps nothing."""
    root, runs = tmp_path / "pkg", str(tmp_path / "runs")
    kept, gone, fresh = root / ("a" * 16), root / ("b" * 16), root / ("c" * 16)
    for version in (kept, gone, fresh):
        (version / "trainer").mkdir(parents=True)
    rebooted = Namespace(agent_pyz, reaps=True)
    try:
        assert launch(rebooted, runs, "policy", ["sleep", "60"], "--restart", "on-failure:1",
                      "--pythonpath", str(kept))[0] == 0
        assert launch(rebooted, runs, "plain", ["sleep", "60"], "--pythonpath", str(gone))[0] == 0
    finally:
        rebooted.stop()  # every process of the namespace killed at once: both runs lost
    for version in (kept, gone):
        os.utime(version, (time.time() - 7200, time.time() - 7200))  # past the lease
    status, out = packages(container, str(fresh), runs)
    assert (status, out["removed"], sorted(os.listdir(root))) == (0, [gone.name], [kept.name, fresh.name]), out
    status, out = container.agent("relaunch", "--runs-dir", runs, "--run-id", "policy", "--new-run-id", "policy-r1",
                                  "--settle", "0.3")
    assert status == 0, out
    container.agent("kill", "--runs-dir", runs, "--run-id", "policy-r1", "--grace", "1")
    os.utime(kept, (time.time() - 7200, time.time() - 7200))
    status, out = packages(container, str(fresh), runs)  # relaunched, and that run ended: nothing holds it now
    assert out["removed"] == [kept.name], out
