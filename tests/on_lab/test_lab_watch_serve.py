"""`watch --serve` on the lab: served inside a lab host's network namespace, every request whose Host does not name
the server refused; the dashboard in a real headless Chromium, served off loopback to a lab namespace with its
token, refusing requests without it, the kill key and its confirmation working in the browser; `watch --once`
naming the seed run's bound. The helpers and the tests without the lab: tests/orchestrator/cli/test_watch_serve.py."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.pool import Connections
from tests.browser import Browser, chromium_path
from tests.lab.workloads import quick_inventory
from tests.orchestrator.cli.test_watch_serve import (SEED_RUN, TEXT_LAYER, check_hosts, foreign_hosts, free_port,
                                                     needs_textual_serve, start_server, status_of, stop)


@pytest.mark.lab
@needs_textual_serve
@pytest.mark.parametrize("bind", ["address", "0.0.0.0"])
def test_off_loopback_a_request_whose_host_names_another_server_is_refused(lab, tmp_path, bind) -> None:
    """Served inside a lab host's network namespace, on its address or on every address there, reached from
    here at that address."""
    host = lab.hosts["pve2"]
    port = 18080  # the namespace is the lab's: nothing else listens there
    proc, _ = start_server("watch", "local", "--serve", "--host", host.address if bind == "address" else bind,
                           "--port", str(port), "--token", "given-token-2-lab-0", netns=host.netns, reach=host.address,
                           env_extra={"XDG_DATA_HOME": str(tmp_path)})
    own = [f"{host.address}:{port}", f"{socket.gethostname()}:{port}"] + ([f"localhost:{port}"] if bind != "address"
                                                                           else [])
    foreign = foreign_hosts(host.address, port) + [f"{host.link.root_address}:{port}"]
    try:
        check_hosts(host.address, port, "given-token-2-lab-0", own=own,
                    foreign=foreign + ([f"127.0.0.1:{port}"] if bind == "address" else []))
    finally:
        stop(proc)


@pytest.fixture()
def seed_run(lab, tmp_path):
    inventory = quick_inventory(lab, tmp_path / "inventory.yaml")
    target = inventory.target("pve1/200")
    with Connections() as conns:
        client = RunClient(inventory, conns)
        run = client.launch(LaunchSpec(target, [sys.executable, "-c", SEED_RUN], "servedseed", grace=1.0))
        yield tmp_path / "inventory.yaml", run.run_id, lambda: client.runs_on(target, [run.run_id])[0].state
        client.kill(target, [run.run_id], grace=1)


def in_namespace(netns: str, url: str) -> int:
    """The HTTP status a client inside a lab host's network namespace gets for `url`."""
    code = ("import sys, urllib.request, urllib.error\ntry:\n    print(urllib.request.urlopen(sys.argv[1], "
            "timeout=10).status)\nexcept urllib.error.HTTPError as exc:\n    print(exc.code)")
    result = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, url],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.mark.lab
@pytest.mark.asyncio
@needs_textual_serve
@pytest.mark.skipif(chromium_path() is None, reason="needs chromium (Debian: apt-get install chromium)")
async def test_the_dashboard_in_a_browser_off_loopback_with_its_token(lab, seed_run, tmp_path) -> None:
    inventory_path, run_id, state_of = seed_run
    host = lab.hosts["pve1"]
    address = host.link.root_address  # this machine's side of pve1's link: reachable from pve1, not loopback
    port = free_port(address)
    proc, url = start_server("--inventory", str(inventory_path), "watch", "pve1/200", "--serve",
                             "--host", address, "--port", str(port))
    try:
        token = re.fullmatch(rf"http://{re.escape(address)}:{port}/\?token=([\w-]+)", url).group(1)
        bare = f"http://{address}:{port}/"
        # from the lab host: the page and its websocket refused without the token, the page served with it
        assert in_namespace(host.netns, bare) == 403
        assert in_namespace(host.netns, bare + "ws") == 403
        assert in_namespace(host.netns, bare + "?token=wrong-token-x") == 403
        assert in_namespace(host.netns, url) == 200
        assert status_of(bare + "static/js/textual.js") == 403

        async with Browser(width=1400, height=900) as browser:
            await browser.open(url)
            killed = await kill_from_the_browser(browser, state_of, tmp_path)
        assert killed, f"the run is {state_of()} after pressing k, y in the browser"
    finally:
        stop(proc)
    print(f"screenshots: {tmp_path / 'table.png'} {tmp_path / 'confirm.png'}")
    assert (tmp_path / "table.png").stat().st_size > 20_000  # a full dashboard, not a blank or error page


async def kill_from_the_browser(browser: Browser, state_of, shots: Path) -> bool:
    """Wait until the dashboard shows its run selected, screenshot it, then k (screenshot the confirmation)
    and y: True once the lab says the run was killed."""
    import asyncio

    opened = time.monotonic()
    deadline = opened + 60
    while time.monotonic() < deadline and not selected_row_shown(await browser.pixel(TEXT_LAYER, *FIRST_ROW)):
        await asyncio.sleep(0.5)
    print(f"the run's row showed {time.monotonic() - opened:.1f} s after the page was opened")
    await browser.screenshot(shots / "table.png")
    await browser.focus("textarea")  # the terminal's input: where a person's typing goes once they click in
    await browser.press("k")
    await asyncio.sleep(2)
    await browser.screenshot(shots / "confirm.png")
    # on a loaded machine the dialog can come after the y: then k and y again (a second kill of the same run is
    # harmless), until the lab says killed or 90 s pass
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        await browser.press("y")
        for _ in range(10):
            if state_of() == "killed":
                return True
            await asyncio.sleep(0.5)
        await browser.press("k")
        await asyncio.sleep(2)
    return False


FIRST_ROW = (60, 62)  # a point of the runs table's first row, at the page's default font size


def selected_row_shown(rgba: tuple[int, ...] | None) -> bool:
    """The cursor row's blue: the table has a run in it (an empty table's row stays the background)."""
    return rgba is not None and rgba[2] > 150 and rgba[0] < 80


@pytest.mark.lab
def test_once_json_names_the_seed_runs_bound(seed_run, capsys) -> None:
    """The seed's start-up and step line on the lab's seed GPUs (8 held at 0 %): drafter-bound, in the JSON and
    in the plain snapshot."""
    inventory_path, run_id, _ = seed_run
    assert main(["--inventory", str(inventory_path), "watch", "pve1/200", "--once", "--json"]) == 0
    runs = {run["run_id"]: run for run in json.loads(capsys.readouterr().out)["runs"]}
    assert runs[run_id]["bottleneck"] == {
        "bound_by": "drafter",
        "evidence": "drafter-bound: prefetch queue full 50/50, hidden-state queue 15/50, GPUs 0-4 at 0 %"}
    assert main(["--inventory", str(inventory_path), "watch", "pve1/200", "--once"]) == 0
    assert f"pve1/200 {run_id} drafter-bound: prefetch queue full 50/50" in capsys.readouterr().out
