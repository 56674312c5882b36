"""The terminal belongs to the testbed: while Ray runs, what Ray prints goes to the run's log.

Ray writes to the driver's standard streams from several places: a thread
that prints the raylet's error messages ("(raylet) A worker died or was
killed ...", for every NPU process the testbed SIGKILLs on purpose), its
loggers, its C++ core, and the daemons a local instance starts, which inherit
the driver's file descriptors. :func:`ray_output_to` points file descriptors
1 and 2 at a log file in the run directory for as long as Ray may print, so
all of it lands there, and hands the testbed a stream on the real terminal
for its own lines (the progress display, a suite's rows). The journal already
holds every death the testbed caused, and an unexpected one ends the run with
the testbed's own error line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


@dataclass(frozen=True)
class Terminal:
    """Streams on the real standard output and error, for the testbed's own lines."""

    out: TextIO
    err: TextIO


@contextlib.contextmanager
def ray_output_to(log: Path) -> Iterator[Terminal]:
    """Inside the block, everything this process (and any process it starts) writes to file
    descriptors 1 and 2 goes to ``log``; the yielded :class:`Terminal` writes to the real ones."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(os.dup(saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        for fd in (1, 2):
            os.dup2(target, fd)
        yield Terminal(out=out, err=err)
    finally:
        for stream in (sys.stdout, sys.stderr, out, err):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(target)
        out.close()
        err.close()
