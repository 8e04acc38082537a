"""A fleet rather than a handful (issue 47): a host with more containers than its sshd allows sessions on one
connection, a controller short of file descriptors, a kill that asks only where its run lives, and a bounded
`watch --once`."""
from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.lab import ContainerSpec, HostSpec, Lab
from tests.lab.workloads import run_cli as cli
from tests.polling import wait_for
from tests.trainer.conftest import REPO_ROOT

pytestmark = pytest.mark.lab
MANY = tuple(range(400, 412))  # 12 containers on one host...
MAX_SESSIONS = 10              # ...whose sshd allows OpenSSH's default of 10 sessions per connection


@pytest.fixture(scope="module")
def fleet(lab: Lab, tmp_path_factory: pytest.TempPathFactory):
    """A lab of its own: `many` with 12 running containers and MaxSessions 10, `other` with one container.
    (`lab` first: the session's lab is the one that reaps what a killed test session left behind.)"""
    root = tmp_path_factory.mktemp("fleet")
    spec = (HostSpec("many", tuple(ContainerSpec(ct) for ct in MANY), max_sessions=MAX_SESSIONS),
            HostSpec("other", (ContainerSpec(500),)))
    with Lab.start(root / "lab", spec) as instance:
        yield instance, str(instance.write_inventory(root / "inventory.yaml"))


def test_more_containers_than_the_hosts_max_sessions_all_answer(fleet, capsys, caplog) -> None:
    """Each container's watch stream holds a channel; the 11th is refused by sshd (MaxSessions 10). That refusal
    must cost no other stream its channel: every one of the 12 answers."""
    _, inv = fleet
    targets = [f"many/{ct}" for ct in MANY]
    code, snapshot, err = cli(inv, "watch", *targets, "--once", "--json", "--timeout", "60", capsys=capsys)
    assert isinstance(snapshot, dict), err
    assert snapshot["errors"] == {} and code == 0, snapshot["errors"]
    assert [(h["name"], h["connected"]) for h in snapshot["hosts"]] == [("many", True)]
    said = [r.getMessage() for r in caplog.records if "sessions per connection" in r.getMessage()]
    assert len(said) == 1 and "MaxSessions" in said[0]  # the limit it met is said, once


def test_ps_asks_more_containers_than_the_hosts_max_sessions_at_once_and_all_answer(fleet, capsys,
                                                                                     caplog) -> None:
    """ps asks a host's containers in parallel: 12 channels opened at once on a MaxSessions 10 host. The ones
    refused go over a second connection, and the limit learned is the server's, not the handful of channels
    that had finished opening when the refusal came."""
    _, inv = fleet
    code, listing, err = cli(inv, "ps", *[f"many/{ct}" for ct in MANY], "--json", capsys=capsys)
    assert code == 0, err
    assert all(t["ok"] for t in listing["targets"].values()) and len(listing["targets"]) == len(MANY)
    learned = [r.getMessage() for r in caplog.records if "sessions per connection from now on" in r.getMessage()]
    # near the server's 10 (a channel it has not yet freed, or one refused too that was still opening, may count
    # either way), never the 1 or 2 that had finished opening
    limits = [int(re.search(r"at most (\d+) sessions", said).group(1)) for said in learned]
    assert all(MAX_SESSIONS - 2 <= limit <= MAX_SESSIONS + 2 for limit in limits), learned


def many_hosts_inventory(lab: Lab, path: Path, count: int, per_host: int = 2) -> Path:
    """An inventory of `count` hosts that are all the lab's `many` under other names, `per_host` containers each
    (sharing their host's connection): a fleet's worth of connections from one controller."""
    many = lab.hosts["many"]
    lines = [f"defaults: {{user: root, port: 22, workdir: /workspace, python: {json.dumps(sys.executable)}}}",
             "hosts:"]
    for i in range(count):
        containers = ", ".join(f"{MANY[(i * per_host + j) % len(MANY)]}: {{gpus: 0}}" for j in range(per_host))
        lines += [f"  h{i:02d}:", f"    address: {many.address}",
                  f"    identity_file: {json.dumps(str(lab.client_key))}",
                  f"    known_hosts: {json.dumps(str(lab.known_hosts))}", f"    pct: {json.dumps(many.pct_command)}",
                  f"    containers: {{{containers}}}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def ps_under(inventory: Path, soft: int, hard: int) -> subprocess.CompletedProcess:
    """A real `dflashctl ps --json` over the inventory, started with this RLIMIT_NOFILE."""
    return subprocess.run([sys.executable, "-m", "orchestrator", "--inventory", str(inventory), "ps", "--json"],
                          capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))


@pytest.mark.parametrize("hosts,limit", [(8, 24), (40, 64)])
def test_ps_short_of_file_descriptors_names_each_target_it_could_not_read(fleet, tmp_path, hosts: int,
                                                                         limit: int) -> None:
    """Short of file descriptors (the hard limit too, so it cannot be raised), some channels and connections
    cannot be made: each target it hit is named with that cause and the limit, never "the connection dropped"
    (a sibling's command on the same connection cut short with it), the others are listed, exit 3, no traceback."""
    lab, _ = fleet
    inventory = many_hosts_inventory(lab, tmp_path / "inventory.yaml", hosts)
    proc = ps_under(inventory, limit, limit)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    listed = json.loads(proc.stdout)["targets"]
    assert sorted(listed) == sorted([f"h{i:02d}/{MANY[(2 * i + j) % len(MANY)]}" for i in range(hosts)
                                     for j in range(2)] + ["local"])
    unread = {name: read["error"] for name, read in listed.items() if not read["ok"]}
    assert unread and len(unread) < len(listed), unread
    said = f"dflashctl ran out of file descriptors (ulimit -n {limit})"
    assert all(said in error and "dropped" not in error for error in unread.values()), unread
    assert all(f"error: {name}: " in proc.stderr for name in unread)  # each one named on stderr too


def test_ps_raises_a_low_soft_file_limit_toward_the_hard_one(fleet, tmp_path) -> None:
    """`ulimit -Sn 24` in the shell, the hard limit well above: dflashctl raises its soft limit at start and
    reads every target that the limit of 24 left unread."""
    lab, _ = fleet
    proc = ps_under(many_hosts_inventory(lab, tmp_path / "inventory.yaml", 8), 24, 4096)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    listed = json.loads(proc.stdout)["targets"]
    assert len(listed) == 17 and all(read["ok"] for read in listed.values()), listed


def sessions_accepted(lab: Lab, host: str) -> int:
    """How many SSH logins the host's sshd has let in so far (its log says each)."""
    return (lab.hosts[host].dir / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def sessions_started(lab: Lab, host: str) -> int:
    """How many sessions (commands) the host's sshd has started so far, over all its connections."""
    return (lab.hosts[host].dir / "sshd.log").read_text(errors="replace").count("Starting session:")


def execs(lab: Lab, host: str, ct: int) -> list[list[str]]:
    """Every `pct exec` into the container so far, as the pct stand-in noted it (arguments cut short)."""
    log = lab.hosts[host].containers[ct].dir / "exec.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_ps_watch_once_and_launch_cost_one_session_per_deployed_target(fleet, tmp_path, monkeypatch,
                                                                        capsys) -> None:
    """The deploy check rides in the agent call: where this version's agent is, `ps`, `watch --once` and a
    launch are one SSH session and one `pct exec` on the target; where it is not, the call says so and deploy
    runs first."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lab, inv = fleet
    agent_dir = lab.hosts["other"].containers[500].workspace / ".dflash" / "agent"
    for old in agent_dir.glob("agent-*.pyz"):
        old.unlink()  # the first command below must deploy
    before = len(execs(lab, "other", 500))
    code, _, err = cli(inv, "ps", "other/500", "--json", capsys=capsys)
    assert code == 0, err
    assert list(agent_dir.glob("agent-*.pyz"))  # sent...
    assert len(execs(lab, "other", 500)) - before > 1  # ...after the call said it was missing
    for command in (["ps", "other/500", "--json"], ["watch", "other/500", "--once", "--json"],
                    ["launch", "other/500", "--json", "--name", "brief", "--", "true"]):
        before, sessions = len(execs(lab, "other", 500)), sessions_started(lab, "other")
        code, _, err = cli(inv, *command, capsys=capsys)
        assert code == 0, err
        calls = execs(lab, "other", 500)[before:]
        assert len(calls) == 1 and calls[0][0] == "sh", (command, calls)
        assert sessions_started(lab, "other") - sessions == 1, command


@pytest.fixture()
def sleeper(fleet, tmp_path, monkeypatch, capsys):
    """A live run on many/400, launched with a cache of where runs live of this test's own; killed at the end."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _, inv = fleet
    code, record, err = cli(inv, "launch", "many/400", "--json", "--name", "sleeper", "--", "sleep", "600",
                            capsys=capsys)
    assert code == 0, err
    yield record
    cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_kill_of_a_run_by_its_id_asks_only_its_target(fleet, sleeper, capsys) -> None:
    """launch remembered where the run lives: kill asks many/400 alone, never the other host."""
    lab, inv = fleet
    before = sessions_accepted(lab, "other")
    code, report, err = cli(inv, "kill", sleeper["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0, err
    assert list(report["targets"]) == ["many/400"] and report["targets"]["many/400"]["ok"]
    assert sessions_accepted(lab, "other") == before  # not even connected to


def test_kill_finds_a_run_the_cache_places_wrongly(fleet, sleeper, tmp_path, capsys) -> None:
    """A cache entry is only a shortcut: one that sends kill to the wrong target ends in a search of every
    target, and the run is stopped where it is."""
    _, inv = fleet
    cache = tmp_path / "state" / "dflashctl" / "whereabouts.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({sleeper["run_id"]: ["other/500"]}))
    code, report, err = cli(inv, "kill", sleeper["run_id"], "--grace", "1", "--json", capsys=capsys)
    assert code == 0, err
    assert report["targets"]["many/400"]["ok"]
    code, runs, err = cli(inv, "ps", "many/400", "--all", "--json", capsys=capsys)
    assert [r["state"] for r in runs["runs"] if r["run_id"] == sleeper["run_id"]] == ["killed"]


# A run that starts and stays up but is never seen running: it removes the log that the launch waits for, as a
# loaded target's slow start does not let the launch see it in time
UNVERIFIABLE = "rm -f train.log; exec sleep 600"
FLEET_CTS = [("many", ct) for ct in MANY] + [("other", 500)]


def contacted(lab: Lab, before: dict[str, int]) -> list[str]:
    """The fleet's containers with a `pct exec` since `before` (contacts(lab) then)."""
    return sorted(target for target, count in contacts(lab).items() if count != before[target])


def contacts(lab: Lab) -> dict[str, int]:
    return {f"{host}/{ct}": len(execs(lab, host, ct)) for host, ct in FLEET_CTS}


def test_a_run_started_but_not_seen_running_is_said_so_left_running_and_killed_where_it_is(
        fleet, tmp_path, monkeypatch, capsys) -> None:
    """Such a run was reported failed (exit 1), left running, and not noted where it lives: a user who launched
    it again had two, and `kill ID` asked every target. It is a run started: its id printed, exit 3, ps shows it,
    and a kill of it asks its own target alone."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lab, inv = fleet
    targets = ["many/403", "other/500"]
    code, report, err = cli(inv, "launch", *targets, "--each", "--json", "--name", "unseen", "--", "sh", "-c",
                            UNVERIFIABLE, capsys=capsys)
    ids = {r["target"]: r["run_id"] for r in report["runs"]} if isinstance(report, dict) else {}
    try:
        assert code == 3 and sorted(ids) == targets, (code, err)
        for target in targets:
            assert report["targets"][target] | {"error": ""} == {"ok": False, "unverified": True,
                                                                 "run_id": ids[target], "error": ""}
            assert "left running" in err and f"`dflashctl kill {ids[target]}` stops it" in err
        code, listing, err = cli(inv, "ps", *targets, "--json", capsys=capsys)
        assert sorted((r["target"], r["state"]) for r in listing["runs"] if r["run_id"] in ids.values()) == [
            (target, "running") for target in targets], err
        for target, run_id in ids.items():
            before = contacts(lab)
            code, killed, err = cli(inv, "kill", run_id, "--grace", "1", "--json", capsys=capsys)
            assert code == 0 and list(killed["targets"]) == [target], err
            assert contacted(lab, before) == [target]
    finally:
        cli(inv, "kill", *ids.values(), "--grace", "1", capsys=capsys)


def test_kill_of_a_run_whose_target_does_not_answer_asks_no_other_target(fleet, tmp_path, monkeypatch,
                                                                         capsys) -> None:
    """The cache places the run on other/500, which is down: that is the answer, not a search of every other
    target (which took 11-23 s at 64 hosts and could only end the same way)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lab, inv = fleet
    run_id = "gone-261207-000000-abcd"
    cache = tmp_path / "state" / "dflashctl" / "whereabouts.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({run_id: ["other/500"]}))
    before, sessions = contacts(lab), sessions_accepted(lab, "many")
    lab.pct("other", "stop", "500", check=True)
    try:
        code, _, err = cli(inv, "kill", run_id, "--grace", "1", capsys=capsys)
    finally:
        lab.pct("other", "start", "500", check=True)
    # the container's own error (exit 1, as launch says it), not "no run" after a search
    assert code == 1 and f"cannot look up {run_id!r}: other/500, where it was last seen, did not answer: other/500: " in err, err
    assert "CT 500 not running" in err
    assert contacted(lab, before) in ([], ["other/500"]) and sessions_accepted(lab, "many") == sessions


STEPS = "for n in range(1, 201): print('[%ds] step=%d loss=%.3f' % (n, n, 2.0 / n), flush=True)"


def test_watch_once_summarises_ended_runs_unless_all(fleet, tmp_path, monkeypatch, capsys) -> None:
    """An ended run prints as its record and last step, not its 200 steps and log tail; --all prints it as a live
    run's (its last 20 steps and lines), and with --history 200 whole."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _, inv = fleet
    code, record, err = cli(inv, "launch", "many/401", "--json", "--name", "stepper", "--", "python3", "-c", STEPS,
                            capsys=capsys)
    assert code == 0, err
    run_id = record["run_id"]

    def states() -> list[str]:
        _, listed, _ = cli(inv, "ps", "many/401", "--all", "--json", capsys=capsys)
        return [r["state"] for r in listed["runs"] if r["run_id"] == run_id]

    assert wait_for(lambda: states() == ["succeeded"], 60), states()

    code, summary, err = cli(inv, "watch", "many/401", "--once", "--json", capsys=capsys)
    assert code == 0, err
    run = next(r for r in summary["runs"] if r["run_id"] == run_id)
    assert (run["state"], run["last_step"], run["history"], run["log_tail"]) == ("succeeded", 200, [], [])

    code, recent, err = cli(inv, "watch", "many/401", "--once", "--json", "--all", capsys=capsys)
    run = next(r for r in recent["runs"] if r["run_id"] == run_id)
    assert code == 0 and len(run["history"]) == 20 and "step=200" in run["log_tail"][-1], err
    code, whole, err = cli(inv, "watch", "many/401", "--once", "--json", "--all", "--history", "200", capsys=capsys)
    assert code == 0, err
    run = next(r for r in whole["runs"] if r["run_id"] == run_id)
    assert run["last_step"] == 200 and len(run["history"]) > 100 and "step=200" in run["log_tail"][-1]
    assert len(json.dumps(summary)) * 5 < len(json.dumps(whole))


def test_watch_all_needs_once(fleet, capsys) -> None:
    _, inv = fleet
    code, _, err = cli(inv, "watch", "--all", capsys=capsys)
    assert code == 2 and "--all goes with --once" in err


def test_launch_each_starts_one_run_per_target_in_one_process(fleet, tmp_path, monkeypatch, capsys) -> None:
    """`launch T... --each`: every target gets its run from one process, one command each, and the verify waits
    overlap (10 runs with a 1 s settle each take about one settle, not ten); kill finds them all by id."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lab, inv = fleet
    targets = [f"many/{ct}" for ct in MANY[:9]] + ["other/500"]
    assert cli(inv, "ps", *targets, capsys=capsys)[0] == 0  # the agent is there (deploys are not counted below)
    before = {t: len(execs(lab, t.split("/")[0], int(t.split("/")[1]))) for t in targets}
    started = time.monotonic()
    code, report, err = cli(inv, "launch", *targets, "--each", "--json", "--name", "each", "--", "sleep", "600",
                            capsys=capsys)
    took = time.monotonic() - started
    try:
        assert code == 0, err
        assert sorted(report["targets"]) == sorted(targets) and all(t["ok"] for t in report["targets"].values())
        assert sorted(r["target"] for r in report["runs"]) == sorted(targets)
        assert {r["state"] for r in report["runs"]} == {"running"}
        assert len({r["run_id"] for r in report["runs"]}) == len(targets)
        for target in targets:
            host, ct = target.split("/")
            assert len(execs(lab, host, int(ct))) - before[target] == 1, target
        assert took < 0.6 * len(targets), took  # one settle of 1 s each, in turn, would take 10 s and more
    finally:
        ids = [r["run_id"] for r in report["runs"]] if isinstance(report, dict) else []
        code, killed, err = cli(inv, "kill", *ids, "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and sorted(killed["targets"]) == sorted(targets), err


def test_launch_each_names_the_target_it_could_not_launch_on_and_starts_the_others(fleet, tmp_path, monkeypatch,
                                                                                   capsys) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lab, inv = fleet
    lab.pct("other", "stop", "500", check=True)
    try:
        code, report, err = cli(inv, "launch", "many/402", "other/500", "--each", "--json", "--", "sleep", "600",
                                capsys=capsys)
    finally:
        lab.pct("other", "start", "500", check=True)
    try:
        assert code == 1, err
        assert report["targets"]["many/402"]["ok"] and not report["targets"]["other/500"]["ok"]
        assert "CT 500 not running" in report["targets"]["other/500"]["error"], report
        assert "dflashctl: error: other/500: " in err and "CT 500 not running" in err, err
        assert [r["target"] for r in report["runs"]] == ["many/402"]
    finally:
        cli(inv, "kill", *[r["run_id"] for r in report["runs"]], "--grace", "1", capsys=capsys)
