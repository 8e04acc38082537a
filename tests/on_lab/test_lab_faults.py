"""Faults an operator meets on long runs (issue 20), injected from outside the tool against the lab: each test
fails on the fault it names and passes once the controller handles it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.inventory.model import load_inventory
from orchestrator.runs.deploy import agent_bundle
from orchestrator.runs.spec import runs_dir
from orchestrator.watch.source import LiveSource

from tests.lab.workloads import QUIET, TRACEBACK, fresh_workdir, log_path, quick_inventory, slow_link
from tests.lab.workloads import run_cli as cli
from tests.polling import wait_for as poll

pytestmark = pytest.mark.lab
TARGET = "pve2/300"


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    quick_inventory(lab, path)
    return str(path)


@pytest.fixture()
def quiet_run(inv: str, capsys):
    """A live run that prints one line and waits; killed at the end."""
    code, record, err = cli(inv, "launch", TARGET, "--json", "--name", "quiet", "--", "python3", "-c", QUIET,
                            capsys=capsys)
    assert code == 0, err
    yield record
    cli(inv, "kill", record["run_id"], "--grace", "1", capsys=capsys)


def test_watch_once_shows_a_traceback_that_ends_the_log(lab, inv: str, quiet_run: dict, capsys) -> None:
    # the seed's failure: worker threads die with a traceback, the main thread hangs, the log ends there
    run_id = quiet_run["run_id"]
    log = log_path(lab, load_inventory(Path(inv)), "pve2", 300, run_id)
    with log.open("a") as handle:
        handle.write(TRACEBACK.format(message="x"))
    code, snapshot, err = cli(inv, "watch", TARGET, "--once", "--json", capsys=capsys)
    assert code == 0, err
    run = next(r for r in snapshot["runs"] if r["run_id"] == run_id)
    assert run["exceptions"] == 1 and "RuntimeError: x" in run["exception_texts"][0]
    assert "RuntimeError: x" in run["log_tail"]
    assert any(a["kind"] == "exception" and a["run_id"] == run_id for a in snapshot["alerts"])


def test_kill_of_a_run_on_an_unreachable_host_exits_3(lab, inv: str, quiet_run: dict, capsys) -> None:
    lab.link_down("pve2")
    try:
        code, _, err = cli(inv, "kill", quiet_run["run_id"], "--grace", "1", capsys=capsys)
    finally:
        lab.link_up("pve2")
    assert code == 3, err
    assert "pve2/300" in err and "unreachable" in err


@pytest.mark.parametrize("fault", ["link down", "refused host key"])
def test_ps_of_a_target_it_could_not_read_never_says_no_runs(lab, inv: str, quiet_run: dict, fault: str,
                                                              tmp_path, capsys) -> None:
    # pve2/300 has a live run; ps must not call it empty when it cannot read it, and must say what it did read
    faulty = inv
    if fault == "refused host key":
        (tmp_path / "known_hosts").write_text("")
        faulty = str(quick_inventory(lab, tmp_path / "inventory.yaml").path)
        Path(faulty).write_text(Path(faulty).read_text().replace(str(lab.known_hosts), str(tmp_path / "known_hosts")))
    else:
        lab.link_down("pve2")
    try:
        code, out, err = cli(faulty, "ps", TARGET, capsys=capsys)
        assert code == 3 and "no runs" not in out, out
        assert err.startswith(f"dflashctl: error: {TARGET}: runs not read: pve2: ") and len(err.splitlines()) == 1, err
        code, payload, err = cli(faulty, "ps", TARGET, "--json", capsys=capsys)
        assert code == 3, err
        assert payload["runs"] == [] and payload["targets"][TARGET]["ok"] is False
        assert payload["targets"][TARGET]["error"].startswith("pve2: ")
        code, out, err = cli(faulty, "ps", TARGET, "local", capsys=capsys)  # local was read: it has no runs
        assert code == 3 and out.strip() == "no runs on local (--all shows older ones)", out
    finally:
        lab.link_up("pve2")
    code, payload, err = cli(inv, "ps", TARGET, "--json", capsys=capsys)
    assert code == 0 and payload["targets"] == {TARGET: {"ok": True, "error": None}}, err
    assert quiet_run["run_id"] in [r["run_id"] for r in payload["runs"]]


def test_the_dashboards_retry_countdown_moves_and_then_says_reconnecting(lab, inv: str) -> None:
    inventory = load_inventory(Path(inv))
    lab.link_down("pve2")
    try:
        with LiveSource(inventory, [inventory.target(TARGET)]) as source:
            assert source.wait_until_answered(10)
            assert source.snapshot().hosts[0].retry_in_s is not None
            # nothing arrives while the host is down, yet the countdown the dashboard shows must move on
            started = time.monotonic()
            assert source.wait_for_change(5.0) and time.monotonic() - started < 1.5
            deadline = time.monotonic() + 5
            while not source.snapshot().hosts[0].reconnecting and time.monotonic() < deadline:
                source.wait_for_change(0.2)
            host = source.snapshot().hosts[0]  # the 2 s connect attempt: no frozen "retry in 0 s"
            assert host.reconnecting and host.retry_in_s is None and not host.connected
    finally:
        lab.link_up("pve2")


def test_a_run_without_gpus_holds_them_all_and_the_other_way_round(lab, inv: str, capsys) -> None:
    started = []

    def launch(*extra: str) -> tuple[int, str]:
        code, record, err = cli(inv, "launch", TARGET, "--json", *extra, "--", "sleep", "300", capsys=capsys)
        if code == 0:
            started.append(record["run_id"])
        return code, err

    try:
        code, note = launch()
        assert code == 0
        code, err = launch("--gpus", "0")
        assert code == 1 and started[0] in err
        assert "holds them all" in note  # and the launch said so
        assert launch("--gpus", "0", "--force")[0] == 0
        assert cli(inv, "kill", started[0], "--grace", "1", capsys=capsys)[0] == 0
        code, err = launch()  # the reverse: GPU 0 is held by the forced run now
        assert code == 1 and started[1] in err
        assert launch("--force")[0] == 0
    finally:
        cli(inv, "kill", *started, "--grace", "1", capsys=capsys)


def test_a_damaged_agent_file_is_replaced_not_run(lab, inv: str, capsys) -> None:
    # what a connection reset during the first deploy left before uploads were verified: the first 32,704
    # bytes of the agent under its final, content-addressed name
    agent = agent_bundle()
    installed = (lab.hosts["pve2"].containers[300].workspace / ".dflash" / "agent" / f"agent-{agent.digest}.pyz")
    installed.parent.mkdir(parents=True, exist_ok=True)
    installed.write_bytes(agent.data[:32704])
    code, report, _ = cli(inv, "doctor", TARGET, "--json", capsys=capsys)
    assert report["targets"][TARGET]["agent"] == "damaged"
    assert any("damaged" in w for w in report["targets"][TARGET]["warnings"])
    code, payload, err = cli(inv, "ps", TARGET, "--all", "--json", capsys=capsys)
    assert code == 0, err
    assert "runs" in payload and installed.read_bytes() == agent.data
    code, report, _ = cli(inv, "doctor", TARGET, "--json", capsys=capsys)
    assert report["targets"][TARGET]["agent"] == "ok"


@pytest.fixture()
def full_disk(lab, tmp_path):
    """pve2/300 with its runs directory on a 512 KiB tmpfs (inside the container), and an inventory for it."""
    inv = quick_inventory(lab, tmp_path / "inventory.yaml")
    path = tmp_path / "inventory.yaml"
    path.write_text(path.read_text().replace("300: {gpus: 1}", "300: {gpus: 1, workdir: /workspace/full}"))
    runs = runs_dir(load_inventory(path).target(TARGET))
    ct = ("pve2", 300)
    lab.ct_run(*ct, ["mkdir", "-p", runs])
    assert lab.ct_run(*ct, ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", runs]).returncode == 0
    try:
        yield str(path), runs
    finally:
        keeper = lab.ct_run(*ct, ["cat", f"{runs}/.keeper/keeper.json"], text=True).stdout
        if keeper:
            lab.ct_run(*ct, ["kill", str(json.loads(keeper)["pid"])])
        lab.ct_run(*ct, ["umount", "-l", runs])
    del inv


def test_a_full_disk_hides_no_run_and_keeps_its_exit(lab, full_disk, capsys) -> None:
    inv, runs = full_disk
    code, record, err = cli(inv, "launch", TARGET, "--json", "--name", "filler", "--", "sh", "-c",
                            "sleep 1.5; head -c 4M /dev/zero; exit 3", capsys=capsys)
    assert code == 0, err
    run_id = record["run_id"]
    deadline = time.monotonic() + 15
    while True:
        code, payload, err = cli(inv, "ps", TARGET, "--all", "--json", capsys=capsys)
        assert code == 0, err
        run = next(r for r in payload["runs"] if r["run_id"] == run_id)  # never "no runs"
        if run["state"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (run["state"], run["exit_code"]) == ("failed", 3) and "disk full" in run["error"]
    assert cli(inv, "logs", run_id, "-n", "1", capsys=capsys)[0] == 0
    # a launch on the full disk fails with the reason and leaves no empty run directory behind
    code, _, err = cli(inv, "launch", TARGET, "--name", "second", "--", "sleep", "60", capsys=capsys)
    assert code == 1 and "disk full" in err
    left = lab.ct_run("pve2", 300, ["ls", runs], text=True).stdout.split()
    assert not [name for name in left if name.startswith("second")]

    # and doctor says how little room is left (the workdir is on the container's disk, the runs on the tmpfs)
    path = Path(inv)
    path.write_text(path.read_text().replace("workdir: /workspace/full}", f"workdir: {runs}}}"))
    code, report, _ = cli(inv, "doctor", TARGET, "--json", capsys=capsys)
    checked = report["targets"][TARGET]
    assert checked["free_bytes"] < 64 * 1024 and any("GiB free" in w for w in checked["warnings"])


@pytest.fixture()
def full_workdir(lab, tmp_path):
    """pve2/300 with its whole workdir on a 2 MiB tmpfs (inside the container), and an inventory for it."""
    path = tmp_path / "inventory.yaml"
    quick_inventory(lab, path)
    workdir = "/workspace/fullwd"
    path.write_text(path.read_text().replace("300: {gpus: 1}", f"300: {{gpus: 1, workdir: {workdir}}}"))
    ct = ("pve2", 300)
    lab.ct_run(*ct, ["mkdir", "-p", workdir])
    assert lab.ct_run(*ct, ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", workdir]).returncode == 0
    runs = runs_dir(load_inventory(path).target(TARGET))
    try:
        yield str(path), workdir, runs
    finally:
        keeper = lab.ct_run(*ct, ["cat", f"{runs}/.keeper/keeper.json"], text=True).stdout
        if keeper:
            lab.ct_run(*ct, ["kill", str(json.loads(keeper)["pid"])])
        lab.ct_run(*ct, ["umount", "-l", workdir])


@pytest.mark.parametrize("reserve", [True, False], ids=["reserve", "no-reserve"])
def test_kill_on_a_full_workdir_ends_everything_and_exits_0(lab, full_workdir, capsys, reserve) -> None:
    inv, workdir, runs = full_workdir
    code, record, err = cli(inv, "launch", TARGET, "--json", "--name", "stubborn", "--gpus", "none", "--", "sh",
                            "-c", "trap '' TERM; sleep 300 & sleep 300 & wait", capsys=capsys)
    assert code == 0, err
    run_id = record["run_id"]
    of_run = lambda: [p for p in lab.ct_processes("pve2", 300) if p.environ.get("DFLASH_RUN_ID") == run_id]  # noqa: E731
    assert poll(lambda: len(of_run()) == 3, 5)
    if not reserve:
        lab.ct_run("pve2", 300, ["rm", f"{runs}/{run_id}/.state-reserve"])
    lab.ct_run("pve2", 300, ["sh", "-c", f"cat /dev/zero > {workdir}/ballast"])
    assert lab.ct_run("pve2", 300, ["df", "--output=avail", workdir], text=True).stdout.split()[-1] == "0"
    code, result, err = cli(inv, "kill", run_id, "--grace", "1", "--json", capsys=capsys)
    assert code == 0 and "Traceback" not in err, err
    killed = result["targets"][TARGET]["runs"][0]
    assert killed["ok"] and killed["survivors"] == [] and killed["state"] == "killed", killed
    assert ("state_error" in killed) is not reserve  # without the reserve the end is not on disk, and it says so
    assert of_run() == [] and [p for p in lab.ct_processes("pve2", 300) if p.state == "Z"
                               and p.environ.get("DFLASH_RUN_ID") == run_id] == []


def test_watch_shows_how_little_room_the_runs_have_and_alerts(lab, full_disk, capsys) -> None:
    inv, _ = full_disk  # a 512 KiB tmpfs: under both marks (2 GiB, 5 %) as soon as anything is written
    lab.ct_run("pve2", 300, ["sh", "-c", f"head -c 400k /dev/zero > {full_disk[1]}/ballast"])
    code, snapshot, err = cli(inv, "watch", TARGET, "--once", "--json", capsys=capsys)
    assert code == 0, err
    host = next(h for h in snapshot["hosts"] if h["name"] == "pve2")
    assert host["free_bytes"] < 200 * 1024 and host["total_bytes"] == 512 * 1024 and host["low_disk"]
    low = [a for a in snapshot["alerts"] if a["kind"] == "low_disk"]
    assert len(low) == 1 and low[0]["target"] == TARGET and "KiB free" in low[0]["message"]
    # the marks are the user's: below neither, no alert
    code, snapshot, err = cli(inv, "watch", TARGET, "--once", "--json", "--min-free-gib", "0",
                              "--min-free-pct", "10", capsys=capsys)
    assert code == 0, err
    assert not [a for a in snapshot["alerts"] if a["kind"] == "low_disk"]
    assert not next(h for h in snapshot["hosts"] if h["name"] == "pve2")["low_disk"]


def test_a_truncated_or_rewritten_log_is_announced_and_read_again_whole(lab, inv, quiet_run) -> None:
    inventory, run_id = load_inventory(Path(inv)), quiet_run["run_id"]
    log = log_path(lab, inventory, "pve2", 300, run_id)

    def tail(snapshot):
        run = next((r for r in snapshot.runs if r.run_id == run_id), None)
        return run.log_tail if run else ()

    def lines(prefix: str, count: int) -> str:
        return "".join(f"{prefix} {i}\n" for i in range(count))

    with LiveSource(inventory, [inventory.target(TARGET)], heartbeat_s=1.0) as source:
        assert source.wait_until_answered(20)
        with log.open("a") as handle:
            handle.write(lines("old", 40))
        poll(lambda: "old 39" in tail(source.snapshot()), 5.0, 0.2, pause=source.wait_for_change,
             what="'old 39' in the tail")
        log.write_text(lines("short", 3))  # truncated in place: smaller than what was read
        poll(lambda: "short 2" in tail(source.snapshot()), 5.0, 0.2, pause=source.wait_for_change,
             what="'short 2' in the tail")
        shown = list(tail(source.snapshot()))
        assert any("truncated" in line for line in shown)
        assert shown[shown.index(next(l for l in shown if "truncated" in l)) + 1:] == ["short 0", "short 1", "short 2"]
        with log.open("r+") as handle:  # rewritten in place, ending past the old offset: same inode, same start
            handle.write(lines("new", 60))
        poll(lambda: "new 59" in tail(source.snapshot()), 5.0, 0.2, pause=source.wait_for_change,
             what="'new 59' in the tail")
        shown = list(tail(source.snapshot()))
        mark = max(i for i, line in enumerate(shown) if "dflashctl: train.log was" in line)
        assert "rewritten" in shown[mark] and shown[mark + 1:] == [f"new {i}" for i in range(60)]
        kinds = [a.kind for a in source.snapshot().alerts if a.run_id == run_id]
        assert kinds.count("log_reset") == 2


def test_logs_follow_outlives_a_link_cut_and_prints_every_line_once(lab, inv: str, capsys) -> None:
    count = 90
    code, record, err = cli(inv, "launch", TARGET, "--json", "--name", "lines", "--", "python3", "-c",
                            f"import time\nfor i in range({count}):\n    print('line', i, flush=True)\n"
                            "    time.sleep(0.2)", capsys=capsys)
    assert code == 0, err
    follow = subprocess.Popen([sys.executable, "-m", "orchestrator", "--inventory", inv, "logs", "-f", "-n", "1000",
                               record["run_id"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              bufsize=0)  # unbuffered: readline takes one line, communicate the rest
    try:
        first = follow.stdout.readline()  # it follows now
        lab.link_down("pve2")
        time.sleep(15.0)  # longer than the ~11 s after which `logs -f` used to give up
        lab.link_up("pve2")
        out, err = follow.communicate(timeout=90)  # reconnect backoff, and a handshake the cut may have stalled
        out = first + out
    finally:
        lab.link_up("pve2")
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    assert out.decode().splitlines() == [f"line {i}" for i in range(count)]


def orphan_workload(tag: int) -> list[str]:
    # `kill -9 $PPID` stands in for an OOM-killed supervisor; one child runs with an emptied environment, and
    # one more, started after the supervisor died, also leaves the workload's session (its parent, a subshell,
    # exits at once: the keeper inherits it with nothing that names the run)
    return ["bash", "-c", f"env -i /bin/sleep {tag} & sleep {tag} & sleep 2; kill -9 $PPID; sleep 0.5; "
                          f"(env -i /usr/bin/setsid /bin/sleep {tag} &); exec sleep {tag}"]


def sleeps(lab, tag: int) -> list:
    return [p for p in lab.ct_processes("pve2", 300)
            if p.cmdline[-1:] == [str(tag)] and p.cmdline[0].endswith("sleep") and p.state != "Z"]


def launch_orphaning(lab, inv: str, capsys, tag: int) -> str:
    code, record, err = cli(inv, "launch", TARGET, "--json", "--", *orphan_workload(tag), capsys=capsys)
    assert code == 0, err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the supervisor is gone once its workload runs bare
        if not any("supervise" in " ".join(p.cmdline) and record["run_id"] in " ".join(p.cmdline)
                   for p in lab.ct_processes("pve2", 300)):
            break
        time.sleep(0.1)
    while len(sleeps(lab, tag)) < 4 and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    assert len(sleeps(lab, tag)) == 4
    return record["run_id"]


def test_kill_and_cleanup_after_the_supervisor_died_leave_no_env_cleared_orphan(lab, inv: str, capsys) -> None:
    run_id = launch_orphaning(lab, inv, capsys, 6008)
    code, result, _ = cli(inv, "kill", run_id, "--grace", "1", "--json", capsys=capsys)
    assert code == 0, result
    assert sleeps(lab, 6008) == []
    launch_orphaning(lab, inv, capsys, 6009)
    code, result, _ = cli(inv, "cleanup", TARGET, "--json", capsys=capsys)
    ended = [a for a in result["targets"][TARGET]["actions"] if a["action"] == "end_orphan"]
    assert len(ended) == 4 and sleeps(lab, 6009) == []


def test_one_containers_silent_agent_does_not_end_its_siblings_stream(lab, inv: str) -> None:
    inventory = load_inventory(Path(inv))
    lab.pct("pve1", "start", "201", check=True)
    agent = None
    try:
        targets = [inventory.target("pve1/200"), inventory.target("pve1/201")]
        with LiveSource(inventory, targets, heartbeat_s=1.0) as source:
            assert source.wait_until_answered(20) and source.unreachable() == {}
            agent = next(p for p in lab.ct_processes("pve1", 201) if "watch" in p.cmdline and p.state != "Z")
            os.kill(agent.host_pid, signal.SIGSTOP)  # as starved as an agent on a machine at load 30
            seen: set[str] = set()
            deadline = time.monotonic() + 12
            while "pve1/201" not in seen and time.monotonic() < deadline:
                seen |= set(source.unreachable())
                source.wait_for_change(0.1)
            assert "pve1/201" in seen       # the silent one is noticed...
            for _ in range(10):             # ...and its sibling on the same connection carries on
                seen |= set(source.unreachable())
                time.sleep(0.1)
            assert "pve1/200" not in seen
    finally:
        if agent is not None:
            os.kill(agent.host_pid, signal.SIGCONT)
        lab.pct("pve1", "stop", "201")


SPINNERS = 2  # busy loops beside the 40 clients (which load the machine most): one already loaded before they start
THREE_TARGETS = ("pve1/200", "pve2/300", "local")  # two SSH hosts and this machine: a slow one holds --once back


@pytest.mark.slow
@pytest.mark.loads_machine
@pytest.mark.parametrize("targets", [(TARGET,), THREE_TARGETS], ids=["one-target", "three-targets"])
def test_forty_parallel_ps_and_watch_once_on_a_loaded_machine_see_no_outage(lab, quiet_run: dict, tmp_path,
                                                                            targets: tuple[str, ...]) -> None:
    # what an operator's scripts do on a busy box: 20 `ps` and 20 `watch --once` at once, each its own process
    # with its own SSH connections, against sshds with the default MaxStartups (which drops connections at
    # random past 10 in set-up); none of them may call a reachable host unreachable (with the inventory's
    # default connect timeout: the 2 s of the link-cut tests is too short for 40 handshakes at load 40)
    base = [sys.executable, "-m", "orchestrator", "--inventory", str(lab.write_inventory(tmp_path / "inv.yaml"))]
    # each in a session of its own, as separate scripts are: the kernel shares the CPU between sessions, so
    # the load measured is the spinners' and the clients' own, not whatever else this machine runs
    spawn = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "start_new_session": True}
    started = time.monotonic()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                for _ in range(SPINNERS)]
    clients = []
    try:
        for _ in range(20):
            for argv in (["ps", *targets, "--json"], ["watch", *targets, "--once", "--json"]):
                clients.append((argv[0], subprocess.Popen(base + argv, **spawn)))
        answers = [(kind, proc, *proc.communicate(timeout=150)) for kind, proc in clients]
    finally:
        for proc in spinners + [proc for _, proc in clients]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    answered = {kind: sum(proc.returncode == 0 for k, proc, _, _ in answers if k == kind) for kind in ("ps", "watch")}
    print(f"{len(targets)} target(s): {answered['ps']}/20 ps and {answered['watch']}/20 watch answered in "
          f"{time.monotonic() - started:.1f}s")
    outages = [(kind, proc.returncode, err.decode()[-300:]) for kind, proc, _, err in answers
               if proc.returncode or b"Traceback" in err]
    assert outages == []
    for kind, _, out, _ in answers:
        snapshot = json.loads(out)
        assert snapshot["errors"] == {}, kind
        assert quiet_run["run_id"] in [r["run_id"] for r in snapshot["runs"]], kind


def test_an_upload_cut_mid_way_leaves_no_damaged_agent(lab, tmp_path, capsys) -> None:
    # the first deploy to a fresh workdir over a slow link, and the server side resets the connection while the
    # agent is half sent: nothing may be installed under the agent's final name, and the next command works
    path = tmp_path / "inventory.yaml"
    agent, host = agent_bundle(), lab.hosts["pve2"]
    agent_dir = fresh_workdir(lab, path, "cut") / ".dflash" / "agent"
    final = agent_dir / f"agent-{agent.digest}.pyz"
    with slow_link(lab, "pve2"):  # the upload takes seconds
        ps = subprocess.Popen([sys.executable, "-m", "orchestrator", "--inventory", str(path), "ps", TARGET],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not [p for p in agent_dir.glob("*.tmp.*") if p.stat().st_size > 4096] and time.monotonic() < deadline:
            time.sleep(0.02)
        arrived = sum(p.stat().st_size for p in agent_dir.glob("*.tmp.*"))
        assert 0 < arrived < len(agent.data)
        reset = ["ip", "netns", "exec", host.netns, "ss", "-K", "state", "established", "( sport = :22 )"]
        subprocess.run(reset, check=True, capture_output=True)  # the server's side resets the connection
        _, err = ps.communicate(timeout=60)
    assert ps.returncode == 3, err.decode()
    assert not final.exists()
    code, payload, err = cli(str(path), "ps", TARGET, "--json", capsys=capsys)
    assert code == 0, err
    assert final.read_bytes() == agent.data
    assert list(agent_dir.glob("*.tmp.*")) == []  # what the killed receiver left is gone too
