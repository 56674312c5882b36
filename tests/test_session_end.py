"""The end of a Ray session the testbed started: its processes are waited for, whatever psutil raises."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from testbed.actors import session


def _enoent(*_: Any, **__: Any) -> Any:
    """What psutil 7's ``wait_procs`` raised once at a session's end: pidfd_open's ENOENT for a process
    reaped meanwhile, not a NoSuchProcess."""
    raise FileNotFoundError(2, "No such file or directory")


def test_a_process_gone_while_psutil_fails_to_wait_for_it_counts_as_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    proc = psutil.Process(child.pid)
    child.kill()
    child.wait(5)  # reaped: the pid is gone
    monkeypatch.setattr(session.psutil, "wait_procs", _enoent)
    assert session._wait_ended([proc], 5.0) == []


def test_a_process_still_running_is_returned_after_the_bound_not_waited_for_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setattr(session.psutil, "wait_procs", _enoent)
        start = time.monotonic()
        alive = session._wait_ended([psutil.Process(child.pid)], 0.3)
        assert [p.pid for p in alive] == [child.pid]
        assert time.monotonic() - start < 5.0
    finally:
        child.kill()
        child.wait(5)
