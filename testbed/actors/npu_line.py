"""One NPU process as its supernode sees it, and what waits for it while it is idle.

A supernode keeps markers (aborts, drops) and deaths for an NPU with no call
in flight until its next call that may wait on a peer, and sends them ahead
of that call in one message. After an abort across a large world most NPUs
are done with the step: waking hundreds of idle processes on a few cores for
markers they would read later cost seconds. Opening a new group epoch drops
what belongs to older epochs, as the NPU itself would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

#: NPU methods that never wait on a peer: what was kept for an idle NPU can wait past them
QUIET = frozenset(
    {
        "reset",
        "fresh_job",
        "set_link_faults",
        "set_knob",
        "arm_kill",
        "pid",
        "info",
        "digest",
        "job_scales",
        "serve_open",
        "serve_advance",
    }
)

#: a death to tell an NPU: the rank, and the data-plane address of the process that held it (None:
#: unknown, the death stands whoever holds the rank)
Death = tuple[int, list[Any] | None]


class NPULine:
    """One NPU process as its supernode sees it: the socket to it, its calls in flight, what waits
    for its next call."""

    def __init__(self, conn: Connection, pid: int, rank: int | None, run_id: str | None = None) -> None:
        self.conn = conn
        self.run_id = run_id  # the run it was forked for: its death is news for that run only
        self.pid = pid
        self.rank = rank
        self.info: dict[str, Any] | None = None
        self.results: dict[int, bytes] = {}
        self.dead = False
        self.ended = False  # its death was handled (its peers told): nothing of it is left to come
        self.frozen: dict[str, Any] | None = None
        self.forked_at = time.monotonic()
        self.watched = False  # its socket is in the pump's selector
        #: calls sent and not answered yet (guarded by the supernode's condition)
        self.busy = 0
        #: deaths and markers for it while idle, sent ahead of its next call (guarded likewise)
        self.pending_dead: list[Death] = []
        self.pending_markers: list[tuple[int, int, int, dict[str, Any]]] = []
        self._send_lock = threading.Lock()

    def send(self, msg: Any) -> None:
        """Send ``msg`` to the process (whole: several threads of the supernode send)."""
        with self._send_lock:
            self.conn.send(msg)

    def tell(
        self,
        cond: threading.Condition,
        dead: Death | None = None,
        markers: list[tuple[int, int, int, dict[str, Any]]] | None = None,
    ) -> None:
        """Tell the process of a death or of markers now if a call is in flight on it, else ahead of
        its next call that may wait on a peer, in one message: after an abort across a large world
        most NPUs are done with the step, and waking hundreds of idle processes for markers they
        would read later cost seconds."""
        if self.dead:
            return
        with cond:
            if self.busy == 0:
                if dead is not None:
                    self.pending_dead.append(dead)
                self.pending_markers.extend(markers or [])
                return
        with contextlib.suppress(OSError):
            self.send(("mark_dead", *dead) if dead is not None else ("deliver", markers))

    def send_call(self, cond: threading.Condition, call: tuple[Any, ...]) -> None:
        """Send ``call``, preceded by what was kept for the process while it was idle, if the call may
        wait on a peer. Opening epoch ``e`` drops what belongs to older ones (the NPU would drop it)."""
        method, args = call[2], call[3]
        with self._send_lock:
            dead: list[Death]
            markers: list[tuple[int, int, int, dict[str, Any]]]
            with cond:
                self.busy += 1
                if method in QUIET:
                    dead, markers = [], []
                elif method == "open_group":
                    markers = [m for m in self.pending_markers if m[1] >= int(args[0])]
                    dead, self.pending_dead, self.pending_markers = [], [], []
                else:
                    dead, self.pending_dead = self.pending_dead, []
                    markers, self.pending_markers = self.pending_markers, []
            for rank, address in dead:
                self.conn.send(("mark_dead", rank, address))
            if markers:
                self.conn.send(("deliver", markers))
            self.conn.send(call)
