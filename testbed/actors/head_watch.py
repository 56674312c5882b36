"""Is Ray's head still there? A thread that knocks on its GCS port, so a lost head ends the run fast.

When Ray's head dies, the actors of a run keep answering for a while (their
calls go worker to worker), until every raylet gives up on the GCS (60 s by
default) and takes its workers down, and the driver's own Ray client ends
the process. A run would stall in a Ray call or die without a word. The
watch connects to the GCS's TCP port every ``period_s`` of wall time; after
``misses`` failed attempts in a row (a refused connection: the GCS process
is gone; a timeout: its host is), the head is lost, and the next wait of the
cluster raises :class:`~testbed.core.errors.HeadLost` from the run's own
thread, which stops the run with a journal, a report and how to resume it.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from testbed.core.errors import HeadLost


class HeadWatch:
    """Knocks on the GCS at ``address`` (``host:port``) from a daemon thread until :meth:`stop`."""

    def __init__(self, address: str, period_s: float = 0.25, misses: int = 4) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self._target = (host, int(port))
        self.period_s = period_s
        self.misses = misses
        self.lost: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="head-watch", daemon=True)

    @classmethod
    def of_current_ray(cls) -> HeadWatch:
        """A watch on the GCS of the Ray this process is connected to, started."""
        import ray

        watch = cls(str(ray.get_runtime_context().gcs_address))
        watch.start()
        return watch

    def start(self) -> None:
        """Start knocking."""
        self._thread.start()

    def _knock(self) -> str | None:
        """None if the GCS accepted a connection, else why not."""
        try:
            with socket.create_connection(self._target, timeout=max(self.period_s, 1.0)):
                return None
        except OSError as exc:
            return exc.strerror or type(exc).__name__

    def _watch(self) -> None:
        failed: list[str] = []
        first = 0.0
        while not self._stop.wait(self.period_s):
            why = self._knock()
            if why is None:
                failed = []
                continue
            if not failed:
                first = time.monotonic()
            failed.append(why)
            if len(failed) >= self.misses:
                self.lost = {"address": self.address, "why": failed[-1], "silent_s": time.monotonic() - first}
                return

    def check(self) -> None:
        """Raise :class:`HeadLost` if the head was found lost."""
        lost = self.lost
        if lost is not None:
            raise HeadLost(
                f"Ray's head at {lost['address']} is lost: its GCS refused {self.misses} connections in a "
                f"row over {lost['silent_s']:.1f} s of wall time ({lost['why']})",
                address=lost["address"],
            )

    def stop(self) -> None:
        """Stop knocking (the thread ends within one period)."""
        self._stop.set()


#: how long a wait goes without looking whether Ray's head was lost
HEAD_SLICE_S = 0.5


def wait_one(pending: list[Any], deadline: float, head: HeadWatch | None) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` for one of ``pending`` until ``deadline`` (monotonic), in slices that look at
    ``head``: :class:`HeadLost` as soon as it is lost, even while answers keep coming."""
    import ray

    while True:
        if head is not None:  # a call's answer may come without a head: look every time
            head.check()
        left = max(0.0, deadline - time.monotonic())
        step = left if head is None else min(HEAD_SLICE_S, left)
        ready, rest = ray.wait(pending, num_returns=1, timeout=step)
        if ready or step >= left:
            return ready, rest
