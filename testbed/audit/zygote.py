"""The zygote: one interpreter that imports the frameworks once and forks each rank process from that.

``python -m testbed.audit.zygote FD``, started by the driver with the rank
processes' environment (thread counts 1, ``PYTHONHASHSEED`` pinned). It
imports numpy, the rank process's modules and PyTorch (if installed), and
nothing else: no program's code, no tensor operation. The import leaves the
process single-threaded (no OpenMP pool is started with one thread, so
none can be held across a fork: the hang GNU libgomp is known for needs
OpenMP work before the fork), so each child begins in the state of a fresh
interpreter that imported the same modules, in milliseconds instead of the
second PyTorch's import costs. The child then seeds Python's and numpy's
global generators, imports the program and serves one job
(:func:`testbed.audit.rank_process.serve`).

Requests on the line (a ``SOCK_SEQPACKET`` socketpair the driver made, no
address another process could reach): ``spawn`` with one passed file
descriptor, the child's line to the driver; the zygote answers with the
child's pid. When the line ends, or the zygote fails, it SIGKILLs every
child it forked and waits (bounded) until each is gone, so the driver, which
waits for the zygote, knows none outlives it. A child also dies with the
zygote (``PR_SET_PDEATHSIG`` on Linux), should the zygote itself be killed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import sys
import time

#: how long the zygote waits for the children it SIGKILLed to be gone
REAP_S = 10.0


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the zygote ends (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the zygote died before the request took hold
            os._exit(1)


def _end(children: list[int]) -> None:
    """SIGKILL every child and wait, bounded, until the kernel reaped each (SIGCHLD is ignored)."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + REAP_S
    for pid in children:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.005)


def _preload() -> None:
    import numpy  # noqa: F401

    import testbed.audit.rank_process  # noqa: F401

    if importlib.util.find_spec("torch") is not None:
        import torch
        import torch._dynamo  # noqa: F401  (its first optimizer imports it: 800 modules, 0.8 s)


def main() -> None:
    """Serve spawn requests on the line given as the first argument until it ends."""
    line = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    _preload()
    line.send(b"ready")
    children: list[int] = []
    try:
        _serve(line, children)
    finally:
        _end(children)


def _serve(line: socket.socket, children: list[int]) -> None:
    """Fork one child per ``spawn`` until the line ends; ``children`` gets each pid as it is forked."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(line, 64, 1)
        except OSError:
            return
        if msg != b"spawn" or not fds:
            return
        pid = os.fork()
        if pid == 0:
            line.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _die_with_parent()
            from testbed.audit.rank_process import serve

            serve(fds[0])
        os.close(fds[0])
        children.append(pid)
        try:
            line.send(str(pid).encode())
        except OSError:  # the driver went away between its request and the answer
            return


if __name__ == "__main__":
    main()
