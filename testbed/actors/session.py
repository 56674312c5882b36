"""Ray for one run: a private local instance on 127.0.0.1 (the default), or a given cluster.

When the testbed starts Ray itself it owns every process of that instance:
on exit (normal, error or Ctrl-C) it disconnects from Ray, SIGKILLs every
process of that instance at once (nothing of theirs is needed any more) and
waits for them to end, so nothing outlives the run: 0.4 s, where
``ray.shutdown`` ending them one kind after another took 1.3 s. A second
Ctrl-C during that clean-up is ignored until it is done.
If the driver is SIGKILLed, its :mod:`janitor <testbed.actors.janitor>` ends
those processes and removes Ray's temporary folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import psutil

from testbed.actors import janitor, supernode_pool
from testbed.actors.loopback import keep_ray_on_loopback
from testbed.core.errors import TestbedError

keep_ray_on_loopback()  # before anything imports ray: this module is the one that starts it


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C ignored inside (a clean-up that must not be cut short); nothing on a thread other than
    the main one, where signals cannot be set (and are not delivered)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: Any = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class RaySession:
    """Context manager around ``ray.init`` / ``ray.shutdown``."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self.started = False
        self.connected = False
        self.temp_dir: str | None = None
        self.pids: list[int] = []

    def __enter__(self) -> RaySession:
        keep_ray_on_loopback()
        import ray

        if ray.is_initialized():  # reuse the caller's Ray (a test session's, say)
            return self
        self.connected = True
        if self.address:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
            return self
        # Ray's unix socket paths must stay under 108 bytes: keep the temp dir short.
        self.temp_dir = tempfile.mkdtemp(prefix="tb-", dir="/tmp")
        self.started = True
        ray.init(
            num_cpus=os.cpu_count() or 2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            object_store_memory=256 * 2**20,
            _temp_dir=self.temp_dir,
        )
        self.pids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid != janitor.pid()]
        janitor.keep(self.temp_dir, self.pids)  # removed and ended even if this driver is SIGKILLed
        if self.node_ip != "127.0.0.1":
            ip = self.node_ip
            self.close()
            raise TestbedError(
                f"the local Ray instance came up on {ip}, not 127.0.0.1: 'ray' was imported before "
                "the testbed could keep it on loopback. Call testbed.keep_ray_on_loopback() (or import "
                "testbed.actors.session) first, or set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the "
                "environment",
                ip=ip,
            )
        return self

    @property
    def node_ip(self) -> str:
        """The address Ray advertises for this node."""
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def owned_pids(self) -> list[int]:
        """Processes of the Ray instance this session started (daemons and workers)."""
        if not self.started:
            return []
        now = {p.pid for p in psutil.Process().children(recursive=True)}
        return sorted((now | set(self.pids)) - {janitor.pid()})

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        with sigint_ignored():
            self.close()

    def close(self) -> None:
        """Disconnect if this session connected Ray; if it started Ray, end every process it owned."""
        import ray

        owned = self.owned_pids()
        if self.connected and ray.is_initialized():
            supernode_pool.forget()  # their Ray goes: nothing may call them any more
            _disconnect(self.started)
        if not self.started:
            return
        procs = []
        for pid in owned:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        for p in procs:  # at once: Ray's own shutdown ends them one kind after another (1 s here),
            with contextlib.suppress(psutil.NoSuchProcess):  # and a raylet told to end after its GCS
                p.kill()  # is gone waits 10 s for it; nothing of theirs outlives the session anyway
        alive = _wait_ended(procs, 10.0)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        _wait_ended(alive, 5.0)
        if self.temp_dir:
            time.sleep(0)  # let the kernel release the socket files
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        janitor.forget(self.temp_dir, owned)


def _disconnect(started: bool) -> None:
    """Disconnect this driver from Ray. When the session started Ray, its processes are left to the
    session to end (all at once): ``ray.shutdown`` would end them one kind after another, each given
    up to a second to exit."""
    import ray
    from ray._private import worker

    node = getattr(worker, "_global_node", None) if started else None
    if node is not None:
        worker._global_node = None  # shutdown then only disconnects
    ray.shutdown()


def _wait_ended(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait (at most ``timeout`` seconds) for ``procs`` to end, reaping this process's children; those
    still running after it. A zombie that is not this process's child counts as ended: it runs
    nothing, and its own parent reaps it (an NPU process whose supernode was just killed)."""
    deadline = time.monotonic() + timeout
    alive = procs
    while True:
        # psutil's pidfd_open of a process reaped meanwhile raises ENOENT, not NoSuchProcess
        with contextlib.suppress(OSError):
            _, alive = psutil.wait_procs(alive, timeout=0.02)
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE or proc.ppid() == os.getpid()
    except psutil.NoSuchProcess:
        return False
