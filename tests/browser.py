"""Headless Chromium driven through the DevTools protocol over a pipe (no port is opened).

``chromium --remote-debugging-pipe`` reads protocol messages on its file
descriptor 3 and writes them on 4, each a JSON object ended by a NUL byte.
This module starts it with the flags a closed network needs (no background
networking, no component updates, no sync), attaches to its page, and offers
what the page tests need: load a file, evaluate JavaScript, collect console
errors and uncaught exceptions, take a screenshot. Every wait has a bound.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Where the browser is looked for: $TESTBED_CHROMIUM, then these names on PATH.
NAMES = ("chromium", "chromium-browser", "google-chrome")
HOW_TO_GET_ONE = (
    "no Chromium found: install Debian's (apt-get install chromium), or point $TESTBED_CHROMIUM at a "
    "Chromium or Chrome binary; .ci/run installs it"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--remote-debugging-pipe",
)

#: Runs in the child: move the two pipe ends to fds 3 and 4 (through fds above 9, so that neither
#: overwrites the other), then become the browser.
_TRAMPOLINE = (
    "import fcntl, os, sys\n"
    "r, w = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3])\n"
    "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w)\n"
    "[os.close(int(fd)) for fd in sys.argv[1:3] if int(fd) not in (3, 4)]\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def find_chromium() -> str | None:
    """The browser binary, or None."""
    given = os.environ.get("TESTBED_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    return next((p for p in (shutil.which(n) for n in NAMES) if p), None)


class BrowserError(RuntimeError):
    """The browser did not answer in time, or answered with an error."""


class Chromium:
    """One headless browser and its one page; use as a context manager."""

    def __init__(self, binary: str, width: int = 1200, height: int = 900, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="tb-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}"]
        # the browser's fds 3 and 4 must be the pipe's ends: a small Python puts them there, then execs it
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, str(to_browser_r), str(from_browser_w), *args, "about:blank"],
            pass_fds=(to_browser_r, from_browser_w),
            env={**os.environ, "TMPDIR": self.profile},  # its singleton socket's folder goes with the profile
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def __enter__(self) -> Chromium:
        deadline = time.monotonic() + self.timeout_s
        while True:
            pages = [t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pages:
            raise BrowserError("the browser opened no page")
        attached = self.call("Target.attachToTarget", targetId=pages[0]["targetId"], flatten=True)
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise BrowserError("the browser did not answer in time (or exited)")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("the browser closed its pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (to the page once attached) and wait for its answer."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self.events.append(answer)

    def open(self, path: Path) -> None:
        """Load a local file and wait for its load event."""
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + self.timeout_s
        while not any(e["method"] == "Page.loadEventFired" for e in self.events):
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-like values)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails", {}).get("text")))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text")))
        return out

    def screenshot(self) -> bytes:
        """A PNG of the whole page."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        return base64.b64decode(data)
