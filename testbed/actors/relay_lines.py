"""Lines between supernode actors: relayed markers in batches over TCP, not a Ray call per batch.

A marker (an abort, a hang's drop) from a rank to a peer it has no link to
travels through the supernodes (:meth:`Supernode._relay`). For a peer on
another supernode it waits in an outbox, and every few milliseconds each
outbox goes, as one batch, over a line: a TCP connection from this supernode
actor to that one, opened on first use, on the address its NPUs listen on
(127.0.0.1 on one host). An abort across 24 supernodes made hundreds of Ray
calls of a few ms of CPU each and stalled every supernode for seconds; a
batch over a line costs tens of microseconds.

A line is authenticated before anything is read from it: the connecting
supernode proves it holds the run's secret against the listening one's
published challenge, and the listener proves it in turn
(:mod:`testbed.fabric.handshake`). A batch is data, never
a pickle: a 4-byte length, then a JSON list of markers, each checked (ranks
in the world, a known kind, a header object) before it is delivered. A peer
that fails the proof, or sends a batch outside that format, loses its line
and is reported (``on_refused``).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from testbed.core.secret import RunSecret
from testbed.fabric import handshake
from testbed.fabric.frame_kinds import KINDS

#: one marker for some NPUs of a supernode: ``(src, epoch, kind, header, dsts)``
Item = tuple[int, int, int, dict[str, Any], list[int]]

#: how long an outbox gathers markers before it is sent (a batch per supernode)
GATHER_S = 0.005
#: the largest batch a line takes (an abort across a 384-NPU world is tens of KiB)
MAX_BATCH = 16 << 20
#: wall seconds a batch may take to arrive once its first byte has
READ_S = 10.0

_PURPOSE = b"relay lines"
_HELLO = struct.Struct("!I")  # the connecting supernode's index
_LENGTH = struct.Struct("!I")


def encode(items: list[Item]) -> bytes:
    """One batch on the wire: its length, then the markers as JSON."""
    body = json.dumps([list(item) for item in items], separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def decode(body: bytes, world: int) -> list[Item]:
    """The markers of one batch, each checked; ``ValueError`` naming the first that is malformed."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("a batch that is not JSON") from None
    if not isinstance(raw, list):
        raise ValueError(f"a batch that is a JSON {type(raw).__name__}, not a list of markers")
    items: list[Item] = []
    for i, item in enumerate(raw):
        ok = isinstance(item, list) and len(item) == 5
        if ok:
            src, epoch, kind, header, dsts = item
            ok = (
                _is_int(src)
                and 0 <= src < world
                and _is_int(epoch)
                and epoch >= 0
                and kind in KINDS
                and isinstance(header, dict)
                and isinstance(header.get("tag"), str)
                and isinstance(dsts, list)
                and all(_is_int(d) and 0 <= d < world for d in dsts)
            )
        if not ok:
            raise ValueError(
                f"marker {i} of a batch is not [src, epoch, kind, header, ranks] of a world of {world}"
            )
        items.append((src, epoch, kind, header, dsts))
    return items


class RelayLines:
    """This supernode's lines to the others: outboxes out, batches in (to ``deliver``).

    ``fallback(node, items)`` sends a batch to a supernode whose line address is
    not known yet (a Ray call). ``on_refused(refusal)`` is told of each peer
    refused: a failed proof, or a malformed batch.
    """

    def __init__(
        self,
        index: int,
        host: str,
        secret: RunSecret,
        world: int,
        deliver: Callable[[list[Item]], None],
        fallback: Callable[[int, list[Item]], None],
        on_refused: Callable[[dict[str, Any]], None],
    ) -> None:
        self.index = index
        self._secret, self._world = secret, world
        self._deliver = deliver
        self._fallback = fallback
        self._on_refused = on_refused
        self._listener = socket.create_server((host, 0), backlog=128)
        bound = self._listener.getsockname()
        self._listener_name = f"relay lines of supernode {index} (tcp {bound[0]}:{bound[1]})"
        self._gate = handshake.Gate(secret, _PURPOSE, _HELLO.size)
        self._cond = threading.Condition()
        self._outbox: dict[int, list[Item]] = {}
        self._out: dict[int, socket.socket] = {}
        self._addresses: dict[int, tuple[str, int, str]] = {}
        self._fresh: list[socket.socket] = []
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._threads = [
            threading.Thread(target=target, name=f"lines-{name}-{index}", daemon=True)
            for target, name in ((self._flush, "out"), (self._accept, "accept"), (self._read, "in"))
        ]
        for thread in self._threads:
            thread.start()

    @property
    def address(self) -> tuple[str, int, str]:
        """Where the other supernodes connect to this one, and its challenge (hex) they prove against."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port), self._gate.challenge.hex()

    def set_addresses(self, addresses: dict[int, tuple[str, int, str]]) -> None:
        """The other supernodes' line addresses by index (a line to one that moved is dropped)."""
        with self._cond:
            for node, addr in addresses.items():
                where = (str(addr[0]), int(addr[1]), str(addr[2]))
                if self._addresses.get(node) != where:
                    old = self._out.pop(node, None)
                    if old is not None:
                        old.close()
                self._addresses[node] = where

    def post(self, node: int, item: Item) -> None:
        """Queue ``item`` for supernode ``node`` (sent with the next batch)."""
        with self._cond:
            self._outbox.setdefault(node, []).append(item)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop taking lines and close every one (at the end of a run): the listener, the lines out
        and in, and the threads serving them, so that a supernode kept for the next run keeps none."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self._listener.close()
        with self._cond:
            if self._closed:
                return
            self._closed = True
            out, self._out = list(self._out.values()), {}
            self._cond.notify_all()
            os.write(self._wake_w, b"w")  # the reader closes the lines in, and the pipe
        for line in out:
            line.close()

    def ended(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the threads serving the lines have ended after
        :meth:`close`; True if they all have (nothing of this run's lines can deliver any more)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    # --- out -------------------------------------------------------------------
    def _flush(self) -> None:
        while True:
            with self._cond:
                while not self._outbox and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                out, self._outbox = self._outbox, {}
            for node, items in out.items():
                self._send(node, items)
            time.sleep(GATHER_S)

    def _open(self, addr: tuple[str, int, str]) -> socket.socket:
        sock = socket.create_connection(addr[:2], timeout=handshake.HANDSHAKE_S)
        try:
            challenge = bytes.fromhex(addr[2])
            handshake.introduce(sock, self._secret, _PURPOSE, challenge, _HELLO.pack(self.index))
        except OSError:
            sock.close()
            raise
        return sock

    def _send(self, node: int, items: list[Item]) -> None:
        with self._cond:
            line, addr = self._out.get(node), self._addresses.get(node)
        try:
            if line is None:
                if addr is None:
                    self._fallback(node, items)
                    return
                line = self._open(addr)
                with self._cond:
                    if self._closed:  # the run ended while the line opened
                        line.close()
                        return
                    self._out[node] = line
            line.sendall(encode(items))
        except OSError:  # that supernode is gone (a lost Ray node): its successor gets a new line
            with self._cond:
                self._out.pop(node, None)

    # --- in --------------------------------------------------------------------
    def _refuse(self, sock: socket.socket, peer: str, reason: str) -> None:
        self._on_refused({"listener": self._listener_name, "peer": peer, "reason": reason, "heard": 1})
        with contextlib.suppress(OSError):
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed at shutdown
            threading.Thread(target=self._admit, args=(sock,), name="lines-admit", daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        """Authenticate a new line (off the accept loop), then hand it to the reader."""
        peer = handshake.peer_name(sock)
        try:
            sock.settimeout(handshake.HANDSHAKE_S)
            admitted = handshake.admit(sock, self._gate)
            sock.sendall(self._gate.welcome(admitted))
        except handshake.HandshakeFailed as exc:
            if exc.heard:
                self._refuse(sock, peer, f"no proof of the run's secret: it {exc.reason}")
            else:
                sock.close()
            return
        except OSError:
            sock.close()
            return
        sock.settimeout(READ_S)
        with self._cond:
            if self._closed:  # admitted as the run ended: the reader is gone
                sock.close()
                return
            self._fresh.append(sock)
            os.write(self._wake_w, b"w")

    def _batch(self, sock: socket.socket) -> list[Item]:
        """The next batch from ``sock``; ``EOFError`` at its end, ``ValueError`` if malformed."""
        head = _recv_exact(sock, _LENGTH.size)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_BATCH:
            raise ValueError(f"a batch announcing {length} bytes (the limit is {MAX_BATCH})")
        return decode(_recv_exact(sock, length), self._world)

    def _read(self) -> None:
        watched = selectors.DefaultSelector()
        watched.register(self._wake_r, selectors.EVENT_READ, None)
        while not self._closed:
            for key, _ in watched.select(timeout=1.0):
                line = key.data
                if line is None:  # woken: lines were accepted, or closed
                    os.read(self._wake_r, 4096)
                    with self._cond:
                        fresh, self._fresh = self._fresh, []
                    for new in fresh:
                        watched.register(new, selectors.EVENT_READ, new)
                    continue
                try:
                    items = self._batch(line)
                except ValueError as exc:
                    watched.unregister(line)
                    self._refuse(line, handshake.peer_name(line), f"it sent {exc}")
                    continue
                except (EOFError, OSError):
                    watched.unregister(line)
                    with contextlib.suppress(OSError):
                        line.close()
                    continue
                self._deliver(items)
        self._end_reading(watched)

    def _end_reading(self, watched: selectors.BaseSelector) -> None:
        """Close every line in and the wake pipe (under the lock: no admission writes to it after)."""
        lines = [key.data for key in watched.get_map().values() if key.data is not None]
        watched.close()
        with self._cond:
            lines += self._fresh
            self._fresh = []
            os.close(self._wake_r)
            os.close(self._wake_w)
        for line in lines:
            line.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the line ended")
        buf += chunk
    return bytes(buf)
