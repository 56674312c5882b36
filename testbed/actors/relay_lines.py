"""Lines between supernode actors: relayed markers in batches over TCP, not a Ray call per batch.

A marker (an abort, a hang's drop) from a rank to a peer it has no link to
travels through the supernodes (:meth:`Supernode._relay`). For a peer on
another supernode it waits in an outbox, and every few milliseconds each
outbox goes, as one batch, over a line: a TCP connection from this supernode
actor to that one, opened on first use, on the address its NPUs listen on
(127.0.0.1 on one host). An abort across 24 supernodes made hundreds of Ray
calls of a few ms of CPU each and stalled every supernode for seconds; a
batch over a line costs tens of microseconds.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

#: one marker for some NPUs of a supernode: ``(src, epoch, kind, header, dsts)``
Item = tuple[int, int, int, dict[str, Any], list[int]]

#: how long an outbox gathers markers before it is sent (a batch per supernode)
GATHER_S = 0.005


class RelayLines:
    """This supernode's lines to the others: outboxes out, batches in (to ``deliver``).

    ``fallback(node, items)`` sends a batch to a supernode whose line address is
    not known yet (a Ray call).
    """

    def __init__(
        self,
        index: int,
        host: str,
        deliver: Callable[[list[Item]], None],
        fallback: Callable[[int, list[Item]], None],
    ) -> None:
        self.index = index
        self._deliver = deliver
        self._fallback = fallback
        self._listener = Listener((host, 0), family="AF_INET", backlog=128)
        self._cond = threading.Condition()
        self._outbox: dict[int, list[Item]] = {}
        self._out: dict[int, Connection] = {}
        self._addresses: dict[int, tuple[str, int]] = {}
        self._fresh: list[Connection] = []
        self._wake_r, self._wake_w = os.pipe()
        for target, name in ((self._flush, "out"), (self._accept, "accept"), (self._read, "in")):
            threading.Thread(target=target, name=f"lines-{name}-{index}", daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        """Where the other supernodes connect to this one."""
        host, port = self._listener.address
        return str(host), int(port)

    def set_addresses(self, addresses: dict[int, tuple[str, int]]) -> None:
        """The other supernodes' line addresses by index (a line to one that moved is dropped)."""
        with self._cond:
            for node, addr in addresses.items():
                where = (str(addr[0]), int(addr[1]))
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
        """Stop taking lines (at shutdown)."""
        self._listener.close()

    def _flush(self) -> None:
        while True:
            with self._cond:
                while not self._outbox:
                    self._cond.wait()
                out, self._outbox = self._outbox, {}
            for node, items in out.items():
                self._send(node, items)
            time.sleep(GATHER_S)

    def _send(self, node: int, items: list[Item]) -> None:
        with self._cond:
            line, addr = self._out.get(node), self._addresses.get(node)
        try:
            if line is None:
                if addr is None:
                    self._fallback(node, items)
                    return
                line = Client(addr, family="AF_INET")
                with self._cond:
                    self._out[node] = line
            line.send_bytes(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # that supernode is gone (a lost Ray node): its successor gets a new line
            with self._cond:
                self._out.pop(node, None)

    def _accept(self) -> None:
        while True:
            try:
                line = self._listener.accept()
            except OSError:
                return  # closed at shutdown
            with self._cond:
                self._fresh.append(line)
            os.write(self._wake_w, b"w")

    def _read(self) -> None:
        watched = selectors.DefaultSelector()
        watched.register(self._wake_r, selectors.EVENT_READ, None)
        while True:
            for key, _ in watched.select(timeout=1.0):
                line = key.data
                if line is None:  # woken: lines were accepted
                    os.read(self._wake_r, 4096)
                    with self._cond:
                        fresh, self._fresh = self._fresh, []
                    for new in fresh:
                        watched.register(new, selectors.EVENT_READ, new)
                    continue
                try:
                    data = line.recv_bytes()
                except (EOFError, OSError):
                    watched.unregister(line)
                    with contextlib.suppress(OSError):
                        line.close()
                    continue
                self._deliver(pickle.loads(data))
