"""One NPU process: the loop that carries out its supernode's calls on the rank's :class:`NPU`.

An NPU process is forked by its supernode's :mod:`NPU host <testbed.actors.npu_host>`
and talks to its supernode actor over one unix socket, in pickled messages.
Pickle is safe on this line and only here: the socket is one end of a
``socketpair`` the supernode made and passed to the NPU host as a file
descriptor; it has no address, no listener, and no process but the
supernode and this NPU holds it, so nothing a stranger sends can reach it.
Everything that arrives from a socket with an address (the data plane, the
relay lines) is data, never a pickle.

- supernode to NPU: ``("call", id, method, args)``, ``("mark_dead", rank, address)``,
  ``("deliver", [(src, epoch, kind, header), ...])``;
- NPU to supernode: a kind byte then a pickle: ``R`` a result ``(id, ok, value)``,
  (its call id first, 8 bytes, so that the supernode need not unpickle it),
  ``S`` a signal request ``(action, rank, t, step, point)``, ``I`` the process's
  info once it is ready, ``M`` markers to relay ``(src, epoch, peers, kind, header)``,
  ``X`` a peer its data plane refused (a dict: listener, peer, reason).

Calls run one at a time on the main thread; ``mark_dead`` and ``deliver`` are
carried out at once on the reading thread (as a second Ray actor thread did),
because the main thread may be blocked in a collective waiting for that peer.
A marker (an abort, a drop) to a peer the rank has no link to travels this
way, through the supernodes, instead of over a new link: see
:meth:`testbed.fabric.dataplane.DataPlane.send_markers`. When
the supernode goes away (its socket ends), the process ends too.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

#: Message kinds an NPU process sends to its supernode (the first byte of each message).
RESULT, SIGNAL, INFO, RELAY, REFUSED = b"R", b"S", b"I", b"M", b"X"


def encode(kind: bytes, payload: Any) -> bytes:
    """One message: its kind byte, then the pickled payload."""
    return kind + pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


def picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` naming it with its traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")


class SupervisorLine:
    """The NPU's line to its supernode: a signal (a kill or a freeze of this very process), a relay."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        self.conn = conn
        self.lock = lock

    def signal(self, action: str, rank: int, t: float, step: int, point: str) -> None:
        """Ask the supernode to SIGKILL (``kill``) or SIGSTOP (``hang``) this process now."""
        with self.lock:
            self.conn.send_bytes(encode(SIGNAL, (action, rank, t, step, point)))

    def relay(self, src: int, epoch: int, peers: list[int], kind: int, header: dict[str, Any]) -> None:
        """Have the supernodes deliver one marker frame from rank ``src`` to each of ``peers``."""
        with self.lock:
            self.conn.send_bytes(encode(RELAY, (src, epoch, peers, kind, header)))

    def refused(self, refusal: dict[str, Any]) -> None:
        """Tell the supernode that this NPU's data plane refused a peer (it keeps it for the journal)."""
        with self.lock, contextlib.suppress(OSError):
            self.conn.send_bytes(encode(REFUSED, refusal))


def serve(conn: Connection, npu: Any, lock: threading.Lock) -> None:
    """Carry out the supernode's calls on ``npu`` until the supernode goes away; never returns."""
    work: queue.Queue[tuple[int, str, tuple[Any, ...]]] = queue.Queue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the supernode is gone: so is this NPU
            if msg[0] == "mark_dead":
                if npu.rank >= 0:
                    npu.mark_dead(int(msg[1]), msg[2])
            elif msg[0] == "deliver":
                if npu.rank >= 0:
                    npu.dataplane.deliver(msg[1])
            else:
                work.put((int(msg[1]), str(msg[2]), tuple(msg[3])))

    threading.Thread(target=read, name="supernode-line", daemon=True).start()
    while True:
        call_id, method, args = work.get()
        try:
            reply = (call_id, True, getattr(npu, method)(*args))
        except BaseException as exc:  # every error goes back to the controller, as Ray's did
            reply = (call_id, False, picklable(exc))
        try:
            data = encode(RESULT + call_id.to_bytes(8, "big"), reply)
        except Exception as exc:  # an unpicklable result is the testbed's bug: say so
            data = encode(RESULT + call_id.to_bytes(8, "big"), (call_id, False, picklable(exc)))
        with lock:
            conn.send_bytes(data)
