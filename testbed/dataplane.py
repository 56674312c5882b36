"""The data plane: TCP sockets directly between NPU actor processes.

Ray is only the control plane; a collective made of Ray actor calls costs
milliseconds per hop here, a socket between the actors a small fraction of
that. Every NPU listens on its own port (127.0.0.1 unless told otherwise);
each directed link is one TCP connection, opened by the sender, introduced by
a hello that names the sender's rank and the group epoch. A new epoch (after a
restart) replaces every connection of the old one, so stale bytes from an
aborted collective can never be read as new data.

Sends are queued to one sender thread per link, so a ring where every rank
sends before it receives cannot deadlock on full socket buffers. Every
blocking wait has a wall-clock guard that raises :class:`HarnessHang`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any

from testbed.errors import HarnessHang

DATA = 0
ABORT = 1

_MAGIC = b"TBDP"
_HELLO = struct.Struct("!4sII")  # magic, src rank, epoch
_FRAME = struct.Struct("!BII")  # kind, header length, payload length


class PeerClosed(Exception):
    """The connection from ``src`` closed: its process is gone (internal to the testbed)."""

    def __init__(self, src: int) -> None:
        super().__init__(src)
        self.src = src


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return buf


class _Sender:
    """One outgoing link: a socket and the thread that drains its queue in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: queue.Queue[bytes | None] = queue.Queue()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    self.sock.sendall(item)
            except OSError as exc:  # the peer is gone; the receive side reports it
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.queue.task_done()

    def flush(self, deadline: float) -> bool:
        with self.queue.all_tasks_done:
            while self.queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.queue.all_tasks_done.wait(left)
        return True

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=2.0)
        self.sock.close()


class DataPlane:
    """The sockets of one rank: a listener, its inbound links and its outbound links."""

    def __init__(self, rank: int, host: str = "127.0.0.1", guard_s: float = 60.0) -> None:
        self.rank = rank
        self.guard_s = guard_s
        self.epoch = -1
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)
        self._inbox: dict[int, tuple[int, socket.socket]] = {}
        self._senders: dict[int, _Sender] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) that peers connect to."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.settimeout(self.guard_s)
        try:
            hello = _recv_exact(sock, _HELLO.size)
        except OSError:
            hello = None
        if hello is None:
            sock.close()
            return
        magic, src, epoch = _HELLO.unpack(hello)
        if magic != _MAGIC:
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._cond:
            old = self._inbox.get(src)
            if old is not None and old[0] > epoch:
                sock.close()
                return
            if old is not None:
                old[1].close()
            self._inbox[src] = (epoch, sock)
            self._cond.notify_all()

    def open_epoch(
        self,
        epoch: int,
        addresses: dict[int, tuple[str, int]],
        out_to: Iterable[int],
        in_from: Iterable[int],
    ) -> None:
        """Drop every link of older epochs, connect to ``out_to``, wait for ``in_from``."""
        self.epoch = epoch
        for sender in self._senders.values():
            sender.close()
        self._senders = {}
        with self._cond:
            for src, (ep, sock) in list(self._inbox.items()):
                if ep < epoch:
                    sock.close()
                    del self._inbox[src]
        for dst in out_to:
            sock = socket.create_connection(addresses[dst], timeout=self.guard_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_HELLO.pack(_MAGIC, self.rank, epoch))
            self._senders[dst] = _Sender(sock)
        need = set(in_from)
        deadline = time.monotonic() + self.guard_s
        with self._cond:
            while True:
                missing = sorted(s for s in need if self._inbox.get(s, (-1,))[0] != epoch)
                if not missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HarnessHang(
                        f"rank {self.rank}: no connection from ranks {missing} in epoch {epoch} "
                        f"after {self.guard_s:.0f} s of wall time; a peer did not start or cannot "
                        "reach this rank's listener",
                        rank=self.rank,
                        missing=missing,
                    )
                self._cond.wait(left)

    def send(self, dst: int, kind: int, header: dict[str, Any], payload: bytes = b"") -> None:
        """Queue one frame to ``dst``; frames to one peer arrive in the order sent."""
        head = json.dumps(header, separators=(",", ":")).encode()
        self._senders[dst].queue.put(_FRAME.pack(kind, len(head), len(payload)) + head + payload)

    def broadcast_abort(self, header: dict[str, Any]) -> None:
        """Queue an abort frame on every outbound link."""
        for dst in list(self._senders):
            self.send(dst, ABORT, header)

    def recv(self, src: int) -> tuple[int, dict[str, Any], bytearray]:
        """Block for the next frame from ``src``; raises :class:`PeerClosed` on EOF."""
        with self._cond:
            entry = self._inbox.get(src)
        if entry is None or entry[0] != self.epoch:
            raise PeerClosed(src)
        sock = entry[1]
        try:
            raw = _recv_exact(sock, _FRAME.size)
            if raw is None:
                raise PeerClosed(src)
            kind, hlen, plen = _FRAME.unpack(raw)
            head = _recv_exact(sock, hlen)
            payload = _recv_exact(sock, plen) if plen else bytearray()
        except TimeoutError as exc:
            raise HarnessHang(
                f"rank {self.rank}: nothing from rank {src} for {self.guard_s:.0f} s of wall time; "
                "the testbed itself is stuck (a modelled timeout would have fired in virtual time)",
                rank=self.rank,
                peer=src,
            ) from exc
        except (ConnectionResetError, OSError) as exc:
            raise PeerClosed(src) from exc
        if head is None or payload is None:
            raise PeerClosed(src)
        return kind, json.loads(head), payload

    def flush(self) -> None:
        """Wait until every queued frame is on the wire (bounded by the guard)."""
        deadline = time.monotonic() + self.guard_s
        for dst, sender in self._senders.items():
            if not sender.flush(deadline):
                raise HarnessHang(
                    f"rank {self.rank}: frames to rank {dst} still queued after {self.guard_s:.0f} s",
                    rank=self.rank,
                    peer=dst,
                )

    def close(self) -> None:
        """Close every socket and stop the threads."""
        self._closed = True
        for sender in self._senders.values():
            sender.close()
        with self._cond:
            for _, sock in self._inbox.values():
                sock.close()
            self._inbox.clear()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self._listener.close()
        self._acceptor.join(timeout=2.0)
