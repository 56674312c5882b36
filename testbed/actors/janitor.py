"""What a run leaves on the machine is removed even when its driver is SIGKILLed.

A run makes folders (the NPUs' unix sockets, a private Ray instance's
session) and, when it starts Ray itself, processes. Its own clean-up (on
exit, on error, on Ctrl-C) removes them; a ``SIGKILL`` of the driver skips
that clean-up, and Ray's agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) then outlive it for good. So the first run of a
driver process starts a janitor: a small process of its own session (Ctrl-C
at the terminal does not reach it), holding the read end of a pipe whose
write end only the driver holds. The driver tells it what to remove
(:func:`keep`) and what it removed itself (:func:`forget`), one JSON line
each. When the pipe ends (the driver exited, however it died), the janitor
``SIGKILL``s every process still kept (checked by its start time, so a
reused pid is never hit) and removes every folder still kept, then exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import IO, Any

_lock = threading.Lock()
_pipe: IO[str] | None = None
_pid: int | None = None


def pid() -> int | None:
    """The janitor's process id, once started: it is not one of a run's processes to end."""
    return _pid


def _send(message: dict[str, Any]) -> None:
    """One line to this driver's janitor (started on first use); silently nothing if it is gone."""
    global _pipe, _pid
    with _lock:
        if _pipe is None:
            proc = subprocess.Popen(
                [sys.executable, "-m", "testbed.actors.janitor"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
            )
            _pipe, _pid = proc.stdin, proc.pid
        assert _pipe is not None
        with contextlib.suppress(OSError, ValueError):
            _pipe.write(json.dumps(message) + "\n")
            _pipe.flush()


def keep(folder: str | None = None, pids: list[int] | None = None) -> None:
    """Have ``folder`` removed, and ``pids`` killed, if this driver dies before it forgets them."""
    import psutil

    procs: list[list[float]] = []
    for pid in pids or []:
        with contextlib.suppress(psutil.Error):
            procs.append([pid, psutil.Process(pid).create_time()])
    _send({"keep": folder, "procs": procs})


def forget(folder: str | None = None, pids: list[int] | None = None) -> None:
    """The driver removed ``folder`` and ended ``pids`` itself: the janitor leaves them be."""
    _send({"forget": folder, "pids": list(pids or [])})


def _sweep(folders: set[str], procs: dict[int, float]) -> None:
    """Kill every kept process that is still the one kept (same start time), then remove the folders."""
    import psutil

    for pid, started in procs.items():
        with contextlib.suppress(psutil.Error, OSError):
            if abs(psutil.Process(pid).create_time() - started) < 0.01:
                os.kill(pid, signal.SIGKILL)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    """Read keep/forget lines until the driver's end of the pipe closes, then sweep what is kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    folders: set[str] = set()
    procs: dict[int, float] = {}
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("keep"):
            folders.add(str(message["keep"]))
        procs.update({int(p): float(t) for p, t in message.get("procs") or []})
        if message.get("forget"):
            folders.discard(str(message["forget"]))
        for pid in message.get("pids") or []:
            procs.pop(int(pid), None)
    _sweep(folders, procs)


if __name__ == "__main__":
    main()
