"""The NPU host of one supernode: a small process that forks the supernode's NPU processes.

Each supernode actor starts one (``python -m testbed.actors.npu_host FD``)
and keeps a ``SOCK_SEQPACKET`` line to it. The host imports the NPU program
and the workload once, freezes the garbage collector's view of those objects
(so that children do not copy the pages holding them), and then, for each
request, forks a child that becomes one NPU process. A fork of a warm,
single-threaded process starts in milliseconds and shares every page it
does not write: that is what makes hundreds of NPU processes fit on one
machine, while each stays a real OS process that a real ``SIGKILL`` ends.

Requests (pickled): ``("setup", sys_path, spec, supernode)`` first, then
``("spawn", rank_or_None, host)`` with one passed file descriptor, the
child's socket to the supernode; the host answers each spawn with the
child's pid. A supernode kept for another run asks ``("ping",)`` (the host
answers ``pong``: it serves still), and sends ``setup`` again once it has
ended the last run's NPUs. Pickle is safe here: the line is a ``socketpair`` the supernode
made and passed to this process as a file descriptor, with no address that
another process could connect to. When the line ends (the supernode is gone,
even SIGKILLed), the host ``SIGKILL``s every child it forked, frozen or not,
removes the folder of their unix sockets (and the run's socket folder, once
no supernode has one left in it), and exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

#: Largest request the host reads (a spec with a big workload option set stays far below it).
MAX_REQUEST = 1 << 20


def _become_npu(fd: int, spec: Any, rank: int | None, host: str) -> None:
    """In the forked child: start the NPU of ``rank`` (a spare if None) and serve it; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from testbed.actors.program import NPUProgram
        from testbed.actors.rank_process import INFO, SupervisorLine, encode, serve
        from testbed.train.rank_preemption import install_term_handler

        conn = Connection(fd)
        lock = threading.Lock()
        npu = NPUProgram(rank, dataclasses.replace(spec, host=host), SupervisorLine(conn, lock))
        install_term_handler()  # a preemption's SIGTERM is counted, as a job's handler would
        with lock:
            conn.send_bytes(encode(INFO, npu.info() if rank is not None else {"pid": os.getpid()}))
        serve(conn, npu, lock)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _warm() -> None:
    """Import what every child runs (the NPU program, its line to the supernode, its SIGTERM handler)
    before the first fork: a child then imports nothing (0.3 s of CPU each, measured), and shares
    those modules' pages with its siblings instead of holding its own copy."""
    import testbed.actors.program
    import testbed.actors.rank_process
    import testbed.train.rank_preemption  # noqa: F401


def _setup(request: tuple[Any, ...]) -> tuple[Any, str | None]:
    """Take on a run: its spec (with this supernode's socket folder) and that folder. The workload's
    modules are imported here, once for every child, and what is alive then is frozen out of the
    garbage collector's view (children share its pages)."""
    _, sys_path, spec, supernode = request
    sys.path[:] = sys_path
    folder = _socket_folder(spec.socket_dir, supernode)
    if folder is not None:
        spec = dataclasses.replace(spec, socket_dir=folder)
    spec.make_workload(0)  # imports the workload's modules once, here, for every child
    _warm()
    gc.unfreeze()  # a second run's setup: what the first froze may be collected now
    gc.collect()
    gc.freeze()  # objects alive now are never scanned again: children share their pages
    return spec, folder


def main() -> None:
    """Serve spawn requests on the line given as the first argument until it ends; a new ``setup``
    takes on a new run (its supernode ended the last one's NPUs and saw them gone first)."""
    line = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it ends the run cleanly
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    spec, folder = _setup(pickle.loads(line.recv(MAX_REQUEST)))
    children: list[int] = []
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(line, MAX_REQUEST, 1)
        except OSError:
            msg, fds = b"", []
        if not msg:
            break
        request = pickle.loads(msg)
        if request[0] == "ping":  # asked once the supernode saw every child gone: forget their pids,
            children = []  # which the kernel may give to other processes from now on
            line.send(b"pong")
            continue
        if request[0] == "setup":
            _remove(folder)
            children = []  # ended and seen gone by the supernode: their pids are not theirs any more
            spec, folder = _setup(request)
            continue
        _, rank, host = request
        pid = os.fork()
        if pid == 0:
            line.close()
            _become_npu(fds[0], spec, rank, host)
        os.close(fds[0])
        children.append(pid)
        line.send(pickle.dumps(pid))
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _remove(folder)


def _remove(folder: str | None) -> None:
    """Remove this supernode's socket folder, and the run's once no supernode has one left in it."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last supernode out removes the run's folder
            os.rmdir(os.path.dirname(folder))


def _socket_folder(run_dir: str | None, supernode: int) -> str | None:
    """This supernode's folder for its NPUs' unix sockets, inside the run's (both 0700)."""
    if run_dir is None:
        return None
    folder = os.path.join(run_dir, f"supernode-{supernode}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


if __name__ == "__main__":
    main()
