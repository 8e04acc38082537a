"""`watch --serve` without the lab: every request whose Host does not name the server refused on loopback (DNS
rebinding), what decides access, the usage errors. Served off loopback to a lab namespace, in a real headless
Chromium: tests/on_lab/test_lab_watch_serve.py."""
from __future__ import annotations

import importlib.util
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
from tests.browser import Browser, chromium_path
from tests.seed_logs import SEED_STARTUP, SEED_STEPS

REPO_ROOT = Path(__file__).resolve().parents[3]
needs_textual_serve = pytest.mark.skipif(importlib.util.find_spec("textual_serve") is None,
                                         reason="needs the serve extra: pip install -e '.[serve]'")
TEXT_LAYER = "canvas.xterm-text-layer"  # the canvas the served terminal draws its text on
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
    (["--serve", "--host", "0.0.0.0", "--token", "short"], "at least 16"),
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
@pytest.mark.parametrize("token", [None, "given-token-1-long-enough"])
def test_on_loopback_a_request_whose_host_names_another_server_is_refused(tmp_path, token) -> None:
    port = free_port("127.0.0.1")
    proc, _ = start_server("watch", "local", "--serve", "--port", str(port), *(["--token", token] if token else []),
                           env_extra={"XDG_DATA_HOME": str(tmp_path)})
    try:
        check_hosts("127.0.0.1", port, token, foreign=foreign_hosts("127.0.0.1", port) + [f"[::1]:{port + 1}"],
                    own=[f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost.:{port}"])
    finally:
        stop(proc)


def test_what_decides_access_and_what_the_browser_tab_runs(tmp_path) -> None:
    import shlex

    from orchestrator.cli.watchserve import choose_token, host_ok, is_loopback, same_origin, served_command

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("198.18.0.1") and not is_loopback("myhost")
    assert choose_token("127.0.0.1", None) is None and choose_token("::1", "given-token-of-16") == "given-token-of-16"
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
