"""A real headless Chromium driven over the DevTools protocol (the websocket client of aiohttp, which the serve
extra brings; no browser-automation package): open a page, type keys into it, read a canvas pixel, take a
screenshot. Used by the `watch --serve` tests."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    """One headless Chromium process with one page; `async with Browser() as page: ...`."""

    def __init__(self, *, width: int = 1400, height: int = 900) -> None:
        self.width, self.height = width, height
        self._profile = tempfile.TemporaryDirectory(prefix="dflash-chromium-")
        self._proc: subprocess.Popen[str] | None = None
        self._session = None  # an aiohttp.ClientSession (aiohttp comes with the serve extra)
        self._ws = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> "Browser":
        import aiohttp

        self._proc = subprocess.Popen(
            [chromium_path() or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        endpoint = await asyncio.to_thread(self._devtools_endpoint)
        port = endpoint.split(":")[2].split("/")[0]
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as answer:
            pages = [t for t in await answer.json() if t.get("type") == "page"]
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.call("Page.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None:  # the browser and its helpers (renderer, zygote), which write to the profile
            _signal_group(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                _signal_group(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        await self._remove_profile()

    async def _remove_profile(self) -> None:
        """A helper can still be writing to the profile for a moment after the browser exits (seen under load as
        "Directory not empty: 'Default'"): retry for a few seconds before giving up."""
        deadline = time.monotonic() + 5
        while True:
            try:
                self._profile.cleanup()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def _devtools_endpoint(self) -> str:
        deadline = time.monotonic() + 30
        for line in self._proc.stderr:  # type: ignore[union-attr]
            match = LISTENING.search(line)
            if match:
                return match.group(1)
            if time.monotonic() > deadline:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    async def call(self, method: str, **params) -> dict:
        """One DevTools command; events that arrive meanwhile are dropped."""
        ident = next(self._ids)
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads((await self._ws.receive(timeout=60)).data)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> object:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def focus(self, selector: str) -> bool:
        """Give the keyboard focus to the first element matching `selector`; False if there is none yet."""
        return bool(await self.evaluate(
            f"(e => e ? (e.focus(), true) : false)(document.querySelector({json.dumps(selector)}))"))

    async def pixel(self, selector: str, x: int, y: int) -> tuple[int, ...] | None:
        """The RGBA of a 2D canvas's pixel (a terminal drawn on canvas has no text in the page to read)."""
        value = await self.evaluate(
            f"(c => c ? Array.from(c.getContext('2d').getImageData({x}, {y}, 1, 1).data) : null)"
            f"(document.querySelector({json.dumps(selector)}))")
        return tuple(value) if isinstance(value, list) else None

    async def drawn(self, selector: str, top: float, bottom: float) -> list[tuple[int, int, int]]:
        """The colours drawn (alpha above 0) on a 2D canvas between `top` and `bottom`, as shares of its height:
        one call for a whole band of a terminal's rows, however many pixels."""
        value = await self.evaluate(
            f"(c => {{ if (!c) return null; const y0 = Math.floor(c.height * {top}), y1 = Math.ceil(c.height * "
            f"{bottom}); const d = c.getContext('2d').getImageData(0, y0, c.width, Math.max(y1 - y0, 1)).data; "
            f"const seen = new Set(); for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) "
            f"seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]); return Array.from(seen); }})"
            f"(document.querySelector({json.dumps(selector)}))")
        return [tuple(map(int, colour.split(","))) for colour in value or []]

    async def press(self, key: str) -> None:
        """A key as a person types it (one printable character)."""
        code = f"Key{key.upper()}" if key.isalpha() else ""
        common = {"key": key, "code": code, "windowsVirtualKeyCode": ord(key.upper())}
        await self.call("Input.dispatchKeyEvent", type="keyDown", text=key, **common)
        await self.call("Input.dispatchKeyEvent", type="keyUp", **common)

    async def screenshot(self, path: Path) -> Path:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:  # every process of the group has exited
        pass
