"""Where a rank's peers connect: a TCP listener and a unix socket, every connection authenticated.

Each new connection is admitted off the accept loop (a silent peer holds up
no other, and at most :data:`MAX_PENDING` handshakes run at once): the peer
must prove it holds the run's secret (:mod:`testbed.fabric.handshake`) and
name a rank of the world other than this one, inside that proof. A peer that
fails is closed without a byte of it read as a frame, and reported; a peer
that passes is handed to the data plane as the link from its rank.

The unix socket lives in the run's socket folder (0700, removed by its
owner even when this process is killed), or, without one, in a private
0700 folder of its own, removed by :meth:`Listeners.close`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable
from typing import Any

from testbed.core.secret import RunSecret
from testbed.fabric import handshake

PURPOSE = b"data plane"
HELLO = struct.Struct("!II")  # src rank, epoch: inside the handshake, covered by its proof
#: Connections in their handshake at once, per listener; more are closed at once (a flood).
MAX_PENDING = 256

#: what a refused peer is reported as: {"listener", "peer", "reason", "heard"}
Refusal = dict[str, Any]


def private_folder(prefix: str) -> str:
    """A new folder under /tmp that only this user can enter (0700), for unix sockets."""
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # mkdtemp makes it 0700
    os.chmod(folder, 0o700)
    return folder


class Listeners:
    """A rank's TCP listener and unix socket. ``take(src, epoch, sock)`` registers an admitted link
    (False: it is stale, close it); ``report(refusal)`` is told of each peer refused."""

    def __init__(
        self,
        rank: int,
        secret: RunSecret,
        host: str,
        socket_dir: str | None,
        world: int | None,
        guard_s: float,
        take: Callable[[int, int, socket.socket], bool],
        report: Callable[[Refusal], None],
    ) -> None:
        self.rank, self.secret, self.world, self.guard_s = rank, secret, world, guard_s
        self._take, self._report = take, report
        self._tcp = socket.create_server((host, 0))
        self._own_dir = None if socket_dir else private_folder("tbdp-")
        folder = socket_dir or self._own_dir
        assert folder is not None
        self.unix_path = os.path.join(folder, f"tbdp-{uuid.uuid4().hex[:12]}.sock")
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unix.bind(self.unix_path)
        self._unix.listen(64)
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._closed = False
        self._threads = [
            threading.Thread(target=self._accept_loop, args=(lsock,), daemon=True)
            for lsock in (self._tcp, self._unix)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def tcp_address(self) -> tuple[str, int]:
        """The TCP listener's host and port."""
        host, port = self._tcp.getsockname()[:2]
        return str(host), int(port)

    def name(self, family: int) -> str:
        """How the journal names the listener of ``family``."""
        if family == socket.AF_UNIX:
            return f"data plane of rank {self.rank} (unix socket {self.unix_path})"
        host, port = self.tcp_address
        return f"data plane of rank {self.rank} (tcp {host}:{port})"

    def refuse(self, sock: socket.socket, reason: str, heard: int) -> None:
        """Drop ``sock`` and report its peer (a connection that said nothing at all is only closed:
        a port scan, or a peer killed while it connected)."""
        if heard:
            peer = handshake.peer_name(sock)
            self._report({"listener": self.name(sock.family), "peer": peer, "reason": reason, "heard": heard})
        with contextlib.suppress(OSError):
            sock.close()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            if not self._pending.acquire(blocking=False):  # a flood of handshakes: drop the newest
                sock.close()
                continue
            threading.Thread(target=self._admit, args=(sock,), name="admit", daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        """Authenticate a new connection, then hand it over as the link from the rank it proved to be."""
        try:
            sock.settimeout(min(self.guard_s, handshake.HANDSHAKE_S))
            peer = handshake.admit(sock, self.secret, PURPOSE, HELLO.size)
        except handshake.HandshakeFailed as exc:
            self.refuse(sock, f"no proof of the run's secret: it {exc.reason}", exc.heard)
            return
        except OSError:
            sock.close()
            return
        finally:
            self._pending.release()
        src, epoch = HELLO.unpack(peer.hello)
        if src == self.rank or (self.world is not None and src >= self.world):
            self.refuse(
                sock, f"it claims to be rank {src}, which is not a peer in a world of {self.world}", 1
            )
            return
        sock.settimeout(self.guard_s)
        if not self._take(src, epoch, sock):
            sock.close()  # a link of an older epoch: stale, never read (routine after a restart)
            return
        with contextlib.suppress(OSError):
            handshake.welcome(sock, self.secret, PURPOSE, peer)

    def close(self) -> None:
        """Stop listening; remove the unix socket (and a private folder)."""
        self._closed = True
        for listener in (self._tcp, self._unix):
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
            listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.unix_path)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        for thread in self._threads:
            thread.join(timeout=2.0)
