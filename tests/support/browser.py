"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``),
for tests that watch a page change while it stays open (the live status page).

Why it is shaped so: ``--dump-dom`` (tests/test_status_page.py) reads a page once, after its
load event; a page that updates in place must be read again and again while it is open. The
DevTools protocol does that, and its pipe transport (file descriptors 3 and 4, messages of JSON
ended by a NUL byte) needs no WebSocket client: only the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self


def chromium_path() -> str:
    """The Chromium binary; raises :class:`RuntimeError` naming the package when absent."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("chromium not found: install it with `apt-get install -y chromium`")
    return path


class Browser:
    """One headless Chromium with one page. ``open(url)`` navigates, ``eval(js)`` returns the
    value of a JavaScript expression in the page (JSON-serialisable values), ``wait_for(js,
    timeout)`` polls an expression until it is truthy. ``close`` kills the browser (by its
    PID) and removes nothing else."""

    def __init__(self, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        self._proc = subprocess.Popen(
            [
                chromium_path(), "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                "--remote-debugging-pipe", "about:blank",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),  # filled by the preexec_fn; kept open by close_fds
            preexec_fn=_pipe_fds(to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._w = os.fdopen(to_browser_w, "wb", buffering=0)
        self._r = os.fdopen(from_browser_r, "rb", buffering=0)
        self._buf = b""
        self._id = 0
        self._session: str | None = None

    def _send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self._session is not None and not method.startswith("Target."):
            msg["sessionId"] = self._session
        self._w.write(json.dumps(msg).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            chunk = self._r.read(65536)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\0")
        value: dict[str, Any] = json.loads(line)
        return value

    def open(self, url: str) -> None:
        """Open ``url`` in a new page and attach to it (returns once the navigation started)."""
        target = self._send("Target.createTarget", {"url": url})["targetId"]
        self._session = self._send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]

    def eval(self, expression: str) -> Any:
        """The value of ``expression`` evaluated in the page (``returnByValue``)."""
        result = self._send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, interval: float = 0.02) -> Any:
        """Poll ``expression`` until truthy; its value. Raises :class:`TimeoutError`."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{expression!r} still {value!r} after {timeout}s")
            time.sleep(interval)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(30)
        for f in (self._w, self._r):
            f.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _pipe_fds(read_fd: int, write_fd: int) -> Any:
    """A ``preexec_fn`` putting ``read_fd`` on fd 3 and ``write_fd`` on fd 4 in the child."""

    def move() -> None:
        r, w = os.dup(read_fd), os.dup(write_fd)  # above 4, whatever the originals were
        os.dup2(r, 3)
        os.dup2(w, 4)

    return move
