"""A real headless browser for UI tests: Debian's ``chromium``, driven over the DevTools protocol.

``chromium --screenshot`` alone cannot log in (it takes no cookie); the DevTools protocol can:
the page is opened with Airflow's session cookie set, read as the user sees it (text after the
scripts ran, what they drew) and captured as PNG. The browser runs with its own throwaway profile,
no network services of its own (no component updates, no background networking), and is killed
on exit.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.testing.processes import terminate_process_groups

__all__ = ["HeadlessChromium", "find_chromium"]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--hide-scrollbars", "--mute-audio")  # fmt: skip


def find_chromium() -> str | None:
    """The browser binary (Debian's ``chromium`` package), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class HeadlessChromium:
    """One headless chromium and one page in it; ``with`` starts and kills it."""

    STARTUP_TIMEOUT = 60.0

    def __init__(self, binary: str | None = None, width: int = 1400, height: int = 1800) -> None:
        found = binary or find_chromium()
        if found is None:
            raise FileNotFoundError("chromium is not installed: apt-get install chromium (make test does)")
        self.binary = found
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: Any = None
        self._stack = contextlib.ExitStack()
        self._session = ""
        self._ids = itertools.count(1)

    def __enter__(self) -> HeadlessChromium:
        self._process = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.STARTUP_TIMEOUT
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("chromium did not start (no DevToolsActivePort)")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        from websockets.sync.client import connect

        self._socket = self._stack.enter_context(
            connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=30)
        )
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._socket = None
        if self._process is not None:
            terminate_process_groups([self._process], 5.0)
            self._process = None
        shutil.rmtree(self._profile, ignore_errors=True)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result (events arriving meanwhile are skipped)."""
        assert self._socket is not None
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        while True:
            reply = json.loads(self._socket.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result") or {})

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """A DevTools command to the page."""
        return self._call(method, self._session, **params)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.enable")
        result = self.send("Network.setCookie", name=name, value=value, url=url, httpOnly=True)
        if not result.get("success", True):
            raise RuntimeError(f"chromium refused the cookie {name} for {url}")

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value in the page (JSON-serialisable values)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 60) -> None:
        """Navigate and wait until the ``ready`` expression is true."""
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        time.sleep(0.2)
        while not self.evaluate(ready):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} was not ready ({ready}) within {timeout} s")
            time.sleep(0.2)

    def text(self) -> str:
        """The page's text as rendered (``innerText``)."""
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def screenshot(self, path: str | os.PathLike[str]) -> Path:
        """The whole page as PNG at ``path``."""
        height = int(self.evaluate("Math.max(document.body.scrollHeight, 400)"))
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=min(height, 8000),
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        out = Path(path)
        out.write_bytes(base64.b64decode(data))
        return out
