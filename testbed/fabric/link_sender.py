"""One outgoing link of a rank: its socket, its queue of frames, and who drains it.

A link is opened (connect, hello, the peer's one-byte ack) and drained off
the rank's own thread: a peer that is frozen accepts at the kernel level but
never acks, and only the task opening that link waits for it (bounded by the
socket's timeout), never the rank that sent, which may be leaving its step
with an abort for that peer. Large frames are drained off the rank's thread
too, so a ring where every rank sends before it receives cannot deadlock on
full socket buffers.

The tasks run on a small pool of threads shared by all of a rank's links
(:data:`LINK_THREADS`), not on a thread per link: a rank of a 384-NPU job
that aborts a step tells every peer of the world group, and a thread per
link would start 383 threads in each of 384 processes. Frames of one link
stay in order: at most one task drains a link at a time.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from testbed.core.secret import RunSecret
from testbed.fabric import handshake
from testbed.fabric.frames import DATA, SEQ, encode_head
from testbed.fabric.lane import LANE_MIN, PLACE, SendLane, open_lane
from testbed.fabric.listeners import PURPOSE

#: Frames up to this size go out from the caller's thread when nothing is queued ahead of them:
#: they fit in the socket buffer, so the send cannot block, and skipping the hand-off to the
#: link's task saves a thread switch per message (most of a small message's cost here).
INLINE_BYTES = 64 * 1024
#: Threads a rank's links share: enough for every link of a full mesh (at most 16 ranks) to block
#: on a full socket buffer at once.
LINK_THREADS = 16

Parts = list[bytes | memoryview]
#: a frame whose payload may take the link's lane: encoded when its turn comes
LaneFrame = tuple[int, dict[str, Any], bytes | memoryview]


def tune(sock: socket.socket, buffer: int) -> None:
    """No Nagle delay on TCP; large socket buffers for large messages."""
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, buffer, 4 << 20)


def dial(addr: tuple[Any, ...], machine: str, timeout_s: float) -> socket.socket:
    """A connection to a peer listening at ``addr`` (tuned for sending): its unix socket when it runs
    on this ``machine`` and listens on the same address (the same Ray node), else TCP."""
    if len(addr) >= 4 and addr[3] == machine and os.path.exists(addr[2]):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(addr[2])
    else:
        sock = socket.create_connection((addr[0], addr[1]), timeout=timeout_s)
    try:
        tune(sock, socket.SO_SNDBUF)
    except OSError:
        sock.close()
        raise
    return sock


def link_opener(
    addr: tuple[Any, ...], machine: str, timeout_s: float, secret: RunSecret, hello: bytes
) -> Callable[[], socket.socket]:
    """What opens a link to the peer at ``addr``: dial it, then prove this rank to it."""

    def open_link() -> socket.socket:
        sock = dial(addr, machine, timeout_s)
        try:
            handshake.introduce(sock, secret, PURPOSE, bytes.fromhex(str(addr[4])), hello)
        except OSError:
            sock.close()
            raise
        return sock

    return open_link


def link_pool() -> ThreadPoolExecutor:
    """The pool a rank's links share (threads start only as tasks need them)."""
    return ThreadPoolExecutor(max_workers=LINK_THREADS, thread_name_prefix="link")


class LinkSender:
    """One outgoing link: a socket and a queue drained in order by one task at a time."""

    def __init__(self, open_link: Callable[[], socket.socket], dst: int, pool: ThreadPoolExecutor) -> None:
        self.sock: socket.socket | None = None
        self.error: str | None = None
        self.open = threading.Event()  # set once the link is open (or has failed to open)
        self.lock = threading.Lock()  # one writer on the socket at a time: frames stay whole and in order
        self._state = threading.Condition()  # guards the queue, the count of frames and the drain
        self._queue: collections.deque[Parts | LaneFrame] = collections.deque()
        self.lane: SendLane | None = None
        self._lane_failed = False
        #: payloads sent through the lane
        self.lane_payloads = 0
        self._pending = 0  # frames queued or being sent by the drain
        self._draining = True
        self._open_link, self._dst, self._pool = open_link, dst, pool
        pool.submit(self._drain)  # opens the link now, as the first thing its task does

    def _drain(self) -> None:
        if not self.open.is_set():
            try:
                self.sock = self._open_link()
            except OSError:
                self.error = f"rank {self._dst} did not accept the connection (its process is gone or frozen)"
            finally:
                self.open.set()
        while True:
            with self._state:
                if not self._queue:
                    self._draining = False
                    self._state.notify_all()
                    return
                item = self._queue.popleft()
            try:
                if self.error is None:
                    with self.lock:
                        self._send(item)
            except (OSError, ValueError) as exc:  # the peer is gone (or the link closed under the drain)
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                with self._state:
                    self._pending -= 1
                    self._state.notify_all()

    def offer(self, kind: int, header: dict[str, Any], payload: bytes | memoryview) -> bool:
        """Send a frame now if small and nothing waits ahead of it (True), else queue it (False)."""
        item: Parts | LaneFrame
        if len(payload) >= LANE_MIN and kind == DATA and SEQ not in header and not self._lane_failed:
            item = (kind, dict(header), payload)
        else:
            head = encode_head(kind, header, len(payload))
            item = [head, payload] if len(payload) else [head]
        nbytes = len(item[0]) + len(payload) if isinstance(item, list) else len(payload)
        if nbytes <= INLINE_BYTES and self.error is None and self.open.is_set():
            with self.lock:
                if self._pending == 0:
                    try:
                        self._send(item)
                    except OSError as exc:
                        self.error = f"{type(exc).__name__}: {exc}"
                    return True
        with self._state:
            self._queue.append(item)
            self._pending += 1
            if not self._draining:
                self._draining = True
                self._pool.submit(self._drain)
        return False

    def _send(self, item: Parts | LaneFrame) -> None:
        """Send one frame: its payload through the lane when it may take it and fits, else whole."""
        if isinstance(item, list):
            return self._sendall(item)
        kind, header, payload = item
        place = self._place(payload)
        if place is None:
            return self._sendall([encode_head(kind, header, len(payload)), payload])
        header[PLACE] = place
        self.lane_payloads += 1
        return self._sendall([encode_head(kind, header, 0)])

    def _place(self, payload: bytes | memoryview) -> list[int] | None:
        """Copy ``payload`` into the link's lane (opened on first use, on a unix socket only); its
        place, or None when it goes over the socket."""
        assert self.sock is not None
        if self.lane is None and not self._lane_failed:
            self.lane = open_lane(self.sock)
            self._lane_failed = self.lane is None
        return self.lane.place(self.sock, payload) if self.lane is not None else None

    def _sendall(self, parts: Parts) -> None:
        assert self.sock is not None
        if len(parts) == 1 or len(parts[1]) < 65536:
            self.sock.sendall(b"".join(parts))  # one syscall for small frames
        else:
            for part in parts:
                self.sock.sendall(part)

    def flush(self, deadline: float) -> bool:
        """Wait (until ``deadline``) for every queued frame to be handed to the kernel."""
        with self._state:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._state.wait(left)
        return True

    def close(self) -> None:
        """Close the socket once the queued frames are sent (waiting at most 2 s for them)."""
        with self._state:
            deadline = time.monotonic() + 2.0
            while self._draining and time.monotonic() < deadline:
                self._state.wait(0.1)
        if self.sock is not None:
            self.sock.close()
        if self.lane is not None:
            self.lane.close()
