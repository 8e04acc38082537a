"""`watch --serve`: the dashboard in a real headless Chromium, served off loopback to a lab namespace with its
token, refusing requests without it; the kill key and its confirmation work in the browser; every request whose
Host does not name the server refused (DNS rebinding), on loopback and off it; the usage errors."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.pool import Connections
from tests.browser import Browser, chromium_path
from tests.lab.workloads import quick_inventory
from tests.seed_logs import SEED_STARTUP, SEED_STEPS

REPO_ROOT = Path(__file__).resolve().parents[3]
needs_textual_serve = pytest.mark.skipif(importlib.util.find_spec("textual_serve") is None,
                                         reason="needs the serve extra: pip install -e '.[serve]'")
SERVING = re.compile(r"serving the dashboard on (http://\S+)")
# the seed's start-up and first step line, then quiet: the dashboard names its bound (drafter) from them
SEED_RUN = f"import sys, time; sys.stdout.write({SEED_STARTUP + SEED_STEPS.splitlines()[0] + chr(10)!r}); " \
           "sys.stdout.flush(); time.sleep(3600)"


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def start_server(*args: str, env_extra: dict[str, str] | None = None, netns: str | None = None,
                 reach: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """`dflashctl ... watch --serve ...` as its own process (in network namespace `netns`, reached from here at
    `reach` rather than at the URL's host); (process, the URL it printed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env_extra or {})}
    prefix = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "orchestrator", *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = SERVING.search(line)
        if match:
            url = match.group(1)
            host, port = re.match(r"http://([^/:]+):(\d+)/", url).groups()
            host = reach or host
            while time.monotonic() < deadline:  # the message comes as the server starts: wait for its socket
                try:
                    socket.create_connection((host, int(port)), timeout=1).close()
                    return proc, url
                except OSError:
                    time.sleep(0.1)
        if not line and proc.poll() is not None:
            break
    stop(proc)
    raise AssertionError(f"the server did not start: {proc.stderr.read()}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status_of(url: str, **headers: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


# ------------------------------------------------------------------------------------------------ usage

def test_without_textual_serve_one_line_with_the_install_hint_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "textual_serve", None)  # as if not installed: importing it fails
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    monkeypatch.setenv("XDG_DATA_HOME", "/nonexistent-dflash-test")
    assert main(["watch", "local", "--serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "textual-serve" in err and "pip install 'dflashctl[serve]'" in err


@pytest.mark.parametrize("args, says", [
    (["--port", "9000"], "go with --serve"),
    (["--serve", "--once"], "--serve and --once"),
    (["--serve", "--host", "0.0.0.0", "--token", "short"], "at least 8"),
    (["--serve", "--headless"], "do not go with it"),
    (["--serve", "--notify", "json://127.0.0.1:9/x"], "do not go with it"),
])
def test_serve_usage_mistakes(args, says, capsys) -> None:
    assert main(["watch", "local", *args]) == 2
    assert says in capsys.readouterr().err


@needs_textual_serve
def test_loopback_needs_no_token_but_refuses_another_sites_websocket(tmp_path) -> None:
    port = free_port("127.0.0.1")
    proc, url = start_server("watch", "local", "--serve", "--port", str(port),
                             env_extra={"XDG_DATA_HOME": str(tmp_path)})
    try:
        assert url == f"http://127.0.0.1:{port}/"
        assert status_of(url) == 200
        ws = url + "ws"
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        assert status_of(ws, Origin="http://evil.example", **upgrade) == 403
        # a second server on the same port: one line, exit 2, and never the line that says it serves
        taken = subprocess.run([sys.executable, "-m", "orchestrator", "watch", "local", "--serve", "--port",
                                str(port)], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                               capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and "cannot listen on 127.0.0.1" in taken.stderr
        assert "serving" not in taken.stderr
    finally:
        stop(proc)


def test_the_browser_shows_the_keys_and_a_readable_runs_title_before_any_key_press(tmp_path) -> None:
    """Served, the dashboard starts without the page's focus: the footer stayed blank until the first key press,
    and the runs table's title was drawn in the border's dark blue."""
    import asyncio

    if chromium_path() is None:
        pytest.skip("no Chromium here")
    port = free_port("127.0.0.1")
    proc, url = start_server("watch", "local", "--serve", "--port", str(port),
                             env_extra={"XDG_DATA_HOME": str(tmp_path)})

    async def look() -> tuple[list, list]:
        async with Browser(width=1000, height=600) as browser:
            await browser.open(url)
            deadline = time.monotonic() + 60
            footer = title = []
            while time.monotonic() < deadline and not (footer and title):
                await asyncio.sleep(0.5)
                footer = [c for c in await browser.drawn(TEXT_LAYER, 0.955, 1.0) if bright(c)]  # the keys
                title = [c for c in await browser.drawn(TEXT_LAYER, 0.045, 0.07) if bright(c)]  # the runs title
            await browser.screenshot(tmp_path / "served.png")
            return footer, title

    try:
        footer, title = asyncio.run(look())
    finally:
        stop(proc)
    assert footer, f"no key drawn in the footer before a key press ({tmp_path / 'served.png'})"
    assert title, f"the runs title is not drawn in a bright colour ({tmp_path / 'served.png'})"


def bright(rgb: tuple[int, int, int]) -> bool:
    """Orange, yellow or white text, not the dark backgrounds (the terminal draws those on the same canvas) nor
    the border's dark blue (0, 83, 170)."""
    return rgb[0] > 180 and rgb[1] > 120


# ------------------------------------------------------------------------------------------------ the Host

UPGRADE = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
PATHS = ("/", "/ws", "/static/js/textual.js", "/download/x", "/no-such-page")


def answer(address: str, port: int, path: str, host: str | None, origin: str | None = None) -> int:
    """The status of one GET sent as written (the Host given, or none; a websocket handshake for /ws), as a
    browser sends it to an address a rebound name of another site resolves to."""
    lines = [f"GET {path} HTTP/1.1", *([f"Host: {host}"] if host is not None else []),
             *(UPGRADE if path.startswith("/ws") else ()), *([f"Origin: {origin}"] if origin else ())]
    with socket.create_connection((address, port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status = sock.makefile("rb").readline()
    return int(status.split()[1])


def foreign_hosts(bound: str, port: int) -> list[str]:
    """Host headers that do not name a server bound to `bound`:`port`: another site's names (one made to
    resolve here), the right address on another port or with none, an empty one."""
    return [f"evil.example:{port}", f"localhost.evil.example:{port}", f"{bound}.nip.io:{port}",
            f"{bound}:{port + 1}", bound, f"evil.example:{port}@{bound}:{port}", ""]


def check_hosts(reach: str, port: int, token: str | None, *, foreign: list[str], own: list[str]) -> None:
    """Every path with every foreign Host: 403, even with the token (none at all: aiohttp's 400); with each own
    Host: the page, the websocket and a static file served."""
    query = f"?token={token}" if token else ""
    refused = {(host, path): answer(reach, port, path + query, host, origin=f"http://{host}")
               for host in foreign for path in PATHS}
    assert set(refused.values()) == {403}, {key: code for key, code in refused.items() if code != 403}
    assert {answer(reach, port, path + query, None) for path in PATHS} == {400}
    for host in own:
        served = [answer(reach, port, path + query, host, origin=f"http://{host}") for path in PATHS[:3]]
        assert served == [200, 101, 200], (host, served)


@needs_textual_serve
@pytest.mark.parametrize("token", [None, "given-token-1"])
def test_on_loopback_a_request_whose_host_names_another_server_is_refused(tmp_path, token) -> None:
    port = free_port("127.0.0.1")
    proc, _ = start_server("watch", "local", "--serve", "--port", str(port), *(["--token", token] if token else []),
                           env_extra={"XDG_DATA_HOME": str(tmp_path)})
    try:
        check_hosts("127.0.0.1", port, token, foreign=foreign_hosts("127.0.0.1", port) + [f"[::1]:{port + 1}"],
                    own=[f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost.:{port}"])
    finally:
        stop(proc)


@pytest.mark.lab
@needs_textual_serve
@pytest.mark.parametrize("bind", ["address", "0.0.0.0"])
def test_off_loopback_a_request_whose_host_names_another_server_is_refused(lab, tmp_path, bind) -> None:
    """Served inside a lab host's network namespace, on its address or on every address there, reached from
    here at that address."""
    host = lab.hosts["pve2"]
    port = 18080  # the namespace is the lab's: nothing else listens there
    proc, _ = start_server("watch", "local", "--serve", "--host", host.address if bind == "address" else bind,
                           "--port", str(port), "--token", "given-token-2", netns=host.netns, reach=host.address,
                           env_extra={"XDG_DATA_HOME": str(tmp_path)})
    own = [f"{host.address}:{port}", f"{socket.gethostname()}:{port}"] + ([f"localhost:{port}"] if bind != "address"
                                                                           else [])
    foreign = foreign_hosts(host.address, port) + [f"{host.link.root_address}:{port}"]
    try:
        check_hosts(host.address, port, "given-token-2", own=own,
                    foreign=foreign + ([f"127.0.0.1:{port}"] if bind == "address" else []))
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------------ the lab

@pytest.fixture()
def seed_run(lab, tmp_path):
    inventory = quick_inventory(lab, tmp_path / "inventory.yaml")
    target = inventory.target("pve1/200")
    with Connections() as conns:
        client = RunClient(inventory, conns)
        run = client.launch(LaunchSpec(target, [sys.executable, "-c", SEED_RUN], "servedseed", grace=1.0))
        yield tmp_path / "inventory.yaml", run["run_id"], lambda: client.runs_on(target, [run["run_id"]])[0]["state"]
        client.kill(target, [run["run_id"]], grace=1)


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


TEXT_LAYER = "canvas.xterm-text-layer"
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


def test_what_decides_access_and_what_the_browser_tab_runs(tmp_path) -> None:
    import shlex

    from orchestrator.cli.watchserve import choose_token, host_ok, is_loopback, same_origin, served_command

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("198.18.0.1") and not is_loopback("myhost")
    assert choose_token("127.0.0.1", None) is None and choose_token("::1", "given-token") == "given-token"
    made = choose_token("0.0.0.0", None)
    assert made and len(made) >= 20 and made != choose_token("0.0.0.0", None)
    assert same_origin(None, "h:1") and same_origin("http://H:1", "h:1") and not same_origin("http://e:1", "h:1")
    names = frozenset({"localhost"})
    assert host_ok("[::1]:80", bound="127.0.0.1", port=80, names=names, reached="127.0.0.1")
    assert host_ok("127.0.0.2", bound="localhost", port=80, names=names, reached="127.0.0.1")
    assert not host_ok("[::1:80", bound="127.0.0.1", port=80, names=names, reached="127.0.0.1")
    assert not host_ok("localhost:80x", bound="127.0.0.1", port=80, names=names, reached="127.0.0.1")
    assert host_ok("10.0.0.5:80", bound="::", port=80, names=names, reached="::ffff:10.0.0.5")
    assert not host_ok("10.0.0.6:80", bound="::", port=80, names=names, reached="::ffff:10.0.0.5")
    inventory = tmp_path / "my inventory.yaml"
    argv = shlex.split(served_command(inventory, ["pve1/200", "x;rm -rf /"], 2.5))
    assert argv == [sys.executable, "-m", "orchestrator", "--inventory", str(inventory.resolve()), "watch",
                    "pve1/200", "x;rm -rf /", "--interval", "2.5", "--no-notify"]
