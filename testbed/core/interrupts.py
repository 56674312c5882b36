"""Ctrl-C (or SIGTERM) during a run or an audit: the first interrupts it, later ones are ignored so
that its clean-up can finish.

The handlers are set whatever the process inherited: a command started as a background job of a
script inherits Ctrl-C ignored, and Python then never raises ``KeyboardInterrupt``; inside
:func:`interruptible` a run and an audit both stop on the first signal as they do at a terminal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


def _interrupt_once(signum: int, _frame: Any) -> None:
    """First Ctrl-C (or SIGTERM) interrupts the run; later ones are ignored so clean-up can finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside, the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` and later ones are ignored;
    the handlers before it come back on the way out (nothing changes on a thread other than the main
    one, where signals can be neither set nor delivered)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _interrupt_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
