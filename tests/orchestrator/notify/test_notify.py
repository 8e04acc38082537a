"""Notifications without the lab: which alerts go where, repeats collapsed, one "recovered" line, sending on a
thread of its own against a real HTTP sink on 127.0.0.1 (one per destination: a hung one delays no other, and a
stop says what it could not send), and the mistakes a user can make configuring it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_records.step import StepRecord
from orchestrator.cli import main
from orchestrator.errors import InventoryError
from orchestrator.inventory.model import builtin_inventory, load_inventory
from orchestrator.notify.destinations import destinations
from orchestrator.notify.policy import NotifyPolicy, Outgoing
from orchestrator.notify.pump import FLUSH_S, NOTIFY_FAILED, AlertPump
from orchestrator.notify.sender import Sender
from orchestrator.watch.model import AlertFeed, AlertView, RunStatus
from orchestrator.watch.source import LiveSource
from tests.lab.workloads import run_cli, stop_keeper
from tests.notify_sink import NotifySink
from tests.polling import wait_for

pytest.importorskip("apprise")
REPO = Path(__file__).resolve().parents[3]

STEP_LINE = "[42s] step=42 loss=2.5 acc=0.1 streak=0.5 lr=1e-4 | tgt=1.0b/s dft=1.0b/s (11.7Ktok/s) | ETA=1h"


def alert(kind: str, run_id: str = "r1", message: str = "something", severity: str = "warning") -> AlertView:
    return AlertView(time="2026-01-01T00:00:00Z", run_id=run_id, target="pve1/200", kind=kind, severity=severity,
                     message=message)


def run(state: str = "running", conditions: tuple[str, ...] = (), run_id: str = "r1") -> RunStatus:
    return RunStatus(run_id, "pve1/200", "drafter", state, frozenset(conditions), STEP_LINE)


def feed(*alerts: AlertView, runs: dict[str, RunStatus]) -> AlertFeed:
    return AlertFeed(cursor=0, version=0, alerts=alerts, runs=runs)


def inventory_with(tmp_path: Path, notify_yaml: str):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  local:\n    transport: local\nnotify:\n" + notify_yaml)
    return load_inventory(path)


def kinds_sent(messages: list[Outgoing]) -> list[tuple[str, str]]:
    return [(m.destination.url, m.kind) for m in messages]


def test_each_destination_gets_the_kinds_it_asked_for(tmp_path: Path) -> None:
    inv = inventory_with(tmp_path, "  - url: json://127.0.0.1:9/all\n"
                                   "  - url: json://127.0.0.1:9/failures\n    kinds: [failed, lost]\n")
    everything, failures = (d.url for d in destinations(inv, []))
    policy = NotifyPolicy(destinations(inv, []))
    sent = policy.observe(feed(alert("stall"), alert("throughput"), alert("gpu_idle"),
                               runs={"r1": run(conditions=("stall", "throughput", "gpu_idle"))}), now=0.0)
    assert kinds_sent(sent) == [(everything, "stall"), (everything, "gpu_idle_held")]  # throughput: not asked for
    assert sent[1].title == "dflashctl: drafter on pve1/200: GPUs idle, memory held"
    sent = policy.observe(feed(alert("ended", message="run failed, exit code 3", severity="error"),
                               runs={"r1": run("failed")}), now=1.0)
    assert kinds_sent(sent) == [(everything, "failed"), (failures, "failed")]
    assert sent[0].body.splitlines() == ["failed: run failed, exit code 3", "run r1 (drafter) on pve1/200, failed",
                                         f"last step: {STEP_LINE}"]
    assert sent[0].severity == "error"


def test_a_notification_quotes_the_figures_of_the_steps_metrics_record_as_every_view_does() -> None:
    exact = StepRecord(step=7, loss=2.71828, acc=0.4, tok_per_s=350.4, eta_s=60.0)  # its line reads (0.4Ktok/s)
    policy = NotifyPolicy(destinations(builtin_inventory(), ["json://127.0.0.1:9/x"]))
    [sent] = policy.observe(feed(alert("stall"), runs={"r1": replace(run(conditions=("stall",)), last_step=exact)}),
                            now=0.0)
    assert sent.body.splitlines()[-1] == "last step: step 7: loss 2.7183, acc 0.400, 350 tok/s, ETA 1.0m"


def test_repeats_of_a_kind_collapse_within_the_window_and_are_counted_after_it() -> None:
    policy = NotifyPolicy(destinations(builtin_inventory(), ["json://127.0.0.1:9/x"], repeat_s=600))
    stalled, healthy = {"r1": run(conditions=("stall",))}, {"r1": run()}
    assert [m.kind for m in policy.observe(feed(alert("stall"), runs=stalled), now=0)] == ["stall"]
    assert [m.kind for m in policy.observe(feed(runs=healthy), now=10)] == ["recovered"]
    assert policy.observe(feed(alert("stall"), runs=stalled), now=100) == []  # within 600 s: collapsed
    assert policy.observe(feed(runs=healthy), now=110) == []  # nothing was said of that stall: no recovery either
    assert policy.observe(feed(alert("stall"), runs=stalled), now=300) == []
    [late] = policy.observe(feed(alert("stall", message="no new step for 9m"), runs=stalled), now=700)
    assert late.kind == "stall" and "(2 more stall alerts of this run since the last notification were " \
                                   "collapsed)" in late.body
    other = policy.observe(feed(alert("stall", run_id="r2"), runs={"r2": run(conditions=("stall",), run_id="r2")}),
                           now=701)
    assert [m.run_id for m in other] == ["r2"]  # the window is per run


def test_recovered_once_every_notified_condition_cleared_and_never_for_an_ended_run() -> None:
    policy = NotifyPolicy(destinations(builtin_inventory(), ["json://127.0.0.1:9/x"]))
    both = {"r1": run(conditions=("stall", "nan"))}
    assert [m.kind for m in policy.observe(feed(alert("stall"), alert("nan"), runs=both), now=0)] == ["stall", "nan"]
    assert policy.observe(feed(runs={"r1": run(conditions=("nan",))}), now=1) == []  # still NaN
    [recovered] = policy.observe(feed(runs={"r1": run()}), now=2)
    assert recovered.kind == "recovered" and recovered.severity == "recovered"
    assert recovered.title == "dflashctl: drafter on pve1/200: recovered"
    assert recovered.body.splitlines()[1:] == ["run r1 (drafter) on pve1/200, running", f"last step: {STEP_LINE}"]
    assert policy.observe(feed(runs={"r1": run()}), now=3) == []  # said once
    policy.observe(feed(alert("stall", run_id="r3"), runs={"r3": run(conditions=("stall",), run_id="r3")}), now=4)
    assert policy.observe(feed(runs={"r3": run("killed", run_id="r3")}), now=5) == []  # ended, not recovered


def test_what_a_log_held_when_the_watch_began_is_not_notified() -> None:
    policy = NotifyPolicy(destinations(builtin_inventory(), ["json://127.0.0.1:9/x"]))
    old, new = alert("exception", message="traceback: OSError: old"), alert("exception", message="OSError: new")
    sent = policy.observe(AlertFeed(cursor=2, version=1, alerts=(old, new), backlog=(True, False),
                                    runs={"r1": run()}), now=0)
    assert [m.body.splitlines()[0] for m in sent] == ["exception: OSError: new"]


def test_the_sender_delivers_in_the_background_and_reports_what_failed() -> None:
    failures: list[tuple[Outgoing, str]] = []
    with NotifySink() as sink, NotifySink() as refusing:
        refusing.status = 500
        sinks = destinations(builtin_inventory(), [sink.url(), refusing.url(), "json://127.0.0.1:1/closed"])
        sender = Sender(sinks, lambda message, error: failures.append((message, error)))
        policy = NotifyPolicy(sinks)
        started = time.monotonic()
        sender.submit(policy.observe(feed(alert("exception", message="traceback: RuntimeError: boom", severity="error"),
                                          runs={"r1": run()}), now=0))
        assert time.monotonic() - started < 0.1  # queued, not sent, on the caller's thread
        assert wait_for(lambda: len(failures) == 2 and sink.received, 10), failures
        assert sender.close(10) == []
        [got] = sink.received
        assert got.path == "/hook" and got.title == "dflashctl: drafter on pve1/200: exception"
        assert got.message.startswith("exception: traceback: RuntimeError: boom\nrun r1 (drafter) on pve1/200")
        assert got.type == "failure"
    reasons = {message.destination.url: error for message, error in failures}
    assert set(reasons) == {refusing.url(), "json://127.0.0.1:1/closed"}
    assert "500" in reasons[refusing.url()] and "onnection" in reasons["json://127.0.0.1:1/closed"]


def test_a_service_that_hangs_holds_up_nothing_and_a_failure_shows_as_an_alert() -> None:
    with NotifySink() as hanging, LiveSource(builtin_inventory(), []) as source:
        hanging.hang.set()
        sinks = destinations(builtin_inventory(), ["json://127.0.0.1:1/closed", hanging.url() + "?rto=1"])
        pump = AlertPump(source, sinks).start()
        try:
            for i in range(5):
                started = time.monotonic()
                source.note(alert("stall", run_id=f"r{i}"))
                assert time.monotonic() - started < 0.1
            deadline = time.monotonic() + 15
            while len([a for a in source.snapshot().alerts if a.kind == NOTIFY_FAILED]) < 1:
                assert time.monotonic() < deadline, source.snapshot().alerts
                time.sleep(0.1)
            started = time.monotonic()
        finally:
            pump.stop(flush_s=0.5)
        assert time.monotonic() - started < 5  # a stop does not wait for the hanging service either
    failed = next(a for a in source.snapshot().alerts if a.kind == NOTIFY_FAILED)
    assert failed.severity == "warning" and failed.message.startswith("stall notification to json://127.0.0.1:1/")


NO_APPRISE = "notifications need apprise, which is not installed: pip install 'dflashctl[notify]'"


def test_without_apprise_notify_is_one_line_saying_how_to_install_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "apprise", None)  # import apprise now raises ImportError
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  local:\n    transport: local\n")
    assert main(["-i", str(inv), "watch", "--headless", "--notify", "json://127.0.0.1:9/x"]) == 2
    assert capsys.readouterr().err.strip() == f"dflashctl: error: {NO_APPRISE} (or: pip install apprise)"
    inv.write_text(inv.read_text() + "notify:\n  - url: ntfy://ntfy.sh/my-runs\n")
    assert main(["-i", str(inv), "watch", "--headless"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["-i", str(inv), "watch", "--once", "--json", "--timeout", "0"]) in (0, 3)  # --once sends nothing


@pytest.mark.parametrize(("args", "words"), [
    (["--once", "--notify", "json://127.0.0.1:9/x"], "--notify needs a live watch, not --once"),
    (["--once", "--headless"], "--headless needs a live watch"),
    (["--notify", "json://127.0.0.1:9/x", "--no-notify"], "contradict"),
    (["--headless", "--notify", "nosuchservice://x/y"], "--notify: apprise does not understand the URL"),
    (["--headless", "--notify-repeat", "nan", "--notify", "json://127.0.0.1:9/x"],
     "Invalid value for '--notify-repeat'"),
])
def test_watch_notify_usage_mistakes(tmp_path: Path, capsys, args: list[str], words: str) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  local:\n    transport: local\n")
    assert main(["-i", str(inv), "watch", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


@pytest.mark.parametrize(("entry", "line", "field", "words"), [
    ("  - url: ntfy://ntfy.sh/x\n    kinds: [failed, stal]\n", 6, "notify.0.kinds.1", "did you mean 'stall'"),
    ("  - url: ntfy://ntfy.sh/x\n    repet_s: 5\n", 6, "notify.0.repet_s", "did you mean 'repeat_s'"),
    ("  - url: ntfy://ntfy.sh/x\n  - url: ntfy.sh/x\n", 6, "notify.1.url", "not an apprise URL"),
    ("  - url: ntfy://ntfy.sh/x\n    repeat_s: -1\n", 6, "notify.0.repeat_s", "greater than or equal to 0"),
    ("  - kinds: [failed]\n", 5, "notify.0.url", "required field is missing"),
])
def test_bad_notify_entries_name_file_line_and_field(tmp_path: Path, entry: str, line: int, field: str,
                                                     words: str) -> None:
    with pytest.raises(InventoryError) as info:
        inventory_with(tmp_path, entry)
    assert f"inventory.yaml:{line}: {field}: " in str(info.value) and words in str(info.value), str(info.value)


def test_an_url_apprise_does_not_know_is_refused_with_its_inventory_line(tmp_path: Path, capsys) -> None:
    inv = inventory_with(tmp_path, "  - url: json://127.0.0.1:9/x\n  - url: nosuchservice://x/y\n    kinds: []\n")
    assert main(["-i", str(inv.path), "watch", "--headless"]) == 2
    assert f"{inv.path}:6: notify.1.url: apprise does not understand the URL 'nosuchservice://x/y'" in \
        capsys.readouterr().err


def test_the_notifier_reads_the_alerts_without_taking_the_dashboards_changes() -> None:
    with NotifySink() as sink, LiveSource(builtin_inventory(), []) as source:
        pump = AlertPump(source, destinations(builtin_inventory(), [sink.url()])).start()
        try:
            source.snapshot()  # the dashboard has seen everything so far
            source.note(alert("nan", message="loss is nan at step 7", severity="error"))
            [got] = sink.wait_for(lambda received: len(received) == 1, 10)
            assert got.title == "dflashctl: r1 on pve1/200: nan" and got.message.startswith("nan: loss is nan")
            assert source.wait_for_change(0.5)  # the pump read the same change; the dashboard still gets it
            assert [a.kind for a in source.snapshot().alerts] == ["nan"]
        finally:
            pump.stop()


DOOMED = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\nraise SystemExit(4)"


def test_a_hung_service_delays_no_other_and_a_stop_says_what_it_could_not_send(tmp_path: Path, capsys) -> None:
    """Six runs on `local` fail at once beside a webhook that never answers: see `burst_beside_a_hung_webhook`."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text(f"hosts:\n  local:\n    transport: local\n    workdir: {json.dumps(str(tmp_path / 'work'))}\n"
                   f"    python: {json.dumps(sys.executable)}\n")
    try:
        burst_beside_a_hung_webhook(inv, "local", go=tmp_path / "go", go_seen_by_runs=str(tmp_path / "go"),
                                    capsys=capsys)
    finally:
        stop_keeper(tmp_path / "work" / ".dflash" / "runs")


def burst_beside_a_hung_webhook(inv: Path, target: str, *, go: Path, go_seen_by_runs: str, capsys) -> None:
    """Two webhooks, one that takes the connection and never answers (its read timeout, 30 s, outlasts the test)
    and a healthy one; six runs on `target` fail at once when `go` appears. The healthy one gets each failure
    within 1 s of the watcher's alert; SIGTERM then ends the watcher within the stop's flush, exit 1, with the six
    notifications the hung one never got counted on stderr and in an `unsent` JSON line."""
    printed: list[tuple[float, dict]] = []
    with NotifySink() as hung, NotifySink() as healthy:
        hung.hang.set()
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", str(inv), "watch", target,
                                    "--headless", "--notify", hung.url("hung") + "?rto=30", "--notify",
                                    healthy.url("healthy")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        reader = threading.Thread(target=lambda: printed.extend((time.monotonic(), json.loads(line))
                                                                for line in watcher.stdout), daemon=True)
        reader.start()
        try:
            assert wait_for(lambda: any(line["type"] == "host" for _, line in printed), 60), printed
            runs = []
            for i in range(6):
                code, record, err = run_cli(str(inv), "launch", target, "--name", f"doomed{i}", "--json", "--",
                                            sys.executable, "-c", DOOMED, go_seen_by_runs, capsys=capsys)
                assert code == 0, err
                runs.append(record["run_id"])
            go.touch()
            healthy.wait_for(lambda got: len(got) == 6, 60)
            alerted = {line["run_id"]: at for at, line in printed
                       if line["type"] == "alert" and line["kind"] == "ended"}
            latency = {run_id: next(m.at for m in healthy.received if run_id in m.message) - alerted[run_id]
                       for run_id in runs}
            print("alert -> healthy destination:", ", ".join(f"{s:.2f} s" for s in latency.values()))
            assert max(latency.values()) < 1.0, latency
            signalled = time.monotonic()
            watcher.send_signal(signal.SIGTERM)
            watcher.wait(30)  # its stdout is the reader's: it ends with it
            took = time.monotonic() - signalled
            print(f"SIGTERM -> exit: {took:.2f} s")
            reader.join(10)
            err = watcher.stderr.read()
            assert hung.received == []  # it answers nothing while the test runs
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert took < FLUSH_S + 10  # the stop's flush and a loaded machine's slack, not the hung send's 30 s
    assert watcher.returncode == 1 and "Traceback" not in err, err
    shown = f"json://127.0.0.1:{hung.port}/hung"
    assert f"6 notifications not sent to {shown} (6 failed): not sent within the stop's 5 s" in err, err
    [unsent] = [line for _, line in printed if line["type"] == "unsent"]
    assert unsent["destination"] == shown and unsent["count"] == 6 and unsent["kinds"] == ["failed"] * 6
    assert sorted(unsent["run_ids"]) == sorted(runs)
