"""Where a rank's peers connect: a TCP listener and a unix socket, every connection authenticated.

One thread accepts on both sockets and carries every handshake under way
at once, fed as bytes arrive (a silent peer holds up no other; at most
:data:`MAX_PENDING` at once, each for at most ``HANDSHAKE_S``): the peer
must prove it holds the run's secret (:mod:`testbed.fabric.handshake`) and
name a rank of the world other than this one, inside that proof. A peer that
fails is closed without a byte of it read as a frame, and reported; a peer
that passes is handed to the data plane as the link from its rank. No
thread is started per connection: a 384-NPU job opens tens of thousands of
links.

The unix socket lives in the run's socket folder (0700, removed by its
owner even when this process is killed), or, without one, in a private
0700 folder of its own, removed by :meth:`Listeners.close`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time
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
        self.gate = handshake.Gate(secret, PURPOSE, HELLO.size)
        self._tcp = socket.create_server((host, 0))
        self._own_dir = None if socket_dir else private_folder("tbdp-")
        folder = socket_dir or self._own_dir
        assert folder is not None
        self.unix_path = os.path.join(folder, f"tbdp-{uuid.uuid4().hex[:12]}.sock")
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unix.bind(self.unix_path)
        self._unix.listen(64)
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=f"listen-{rank}", daemon=True)
        self._thread.start()

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

    def _serve(self) -> None:
        """Accept on both sockets and move every handshake under way along, until closed."""
        watched = selectors.DefaultSelector()
        for lsock in (self._tcp, self._unix):
            watched.register(lsock, selectors.EVENT_READ, None)
        watched.register(self._wake_r, selectors.EVENT_READ, False)
        pending: dict[socket.socket, tuple[bytearray, float]] = {}
        while not self._closed:
            now = time.monotonic()
            for sock, (heard, deadline) in list(pending.items()):
                if deadline <= now:  # silent, or stopped mid-hello
                    watched.unregister(sock)
                    del pending[sock]
                    silent = f"no proof of the run's secret: it said {len(heard)} bytes, then nothing"
                    self.refuse(sock, silent, len(heard))
            wait = min((d for _, d in pending.values()), default=now + 1.0) - now
            for key, _ in watched.select(timeout=max(0.0, wait)):
                if key.data is None:
                    self._accept(key.fileobj, watched, pending)  # type: ignore[arg-type]
                elif key.data is False:
                    return
                else:
                    self._hear(key.fileobj, watched, pending)  # type: ignore[arg-type]
        watched.close()

    def _accept(
        self,
        listener: socket.socket,
        watched: selectors.BaseSelector,
        pending: dict[socket.socket, tuple[bytearray, float]],
    ) -> None:
        """A new connection: wait for its hello (a flood past :data:`MAX_PENDING` is closed at once)."""
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        if len(pending) >= MAX_PENDING:
            sock.close()
            return
        sock.setblocking(False)
        pending[sock] = (bytearray(), time.monotonic() + min(self.guard_s, handshake.HANDSHAKE_S))
        watched.register(sock, selectors.EVENT_READ, True)

    def _hear(
        self,
        sock: socket.socket,
        watched: selectors.BaseSelector,
        pending: dict[socket.socket, tuple[bytearray, float]],
    ) -> None:
        """Bytes of a handshake under way: admit the peer once its answer is whole and right."""
        heard, _ = pending[sock]
        try:
            data = sock.recv(4096)
            if not data:
                raise handshake.HandshakeFailed(f"closed after {len(heard)} bytes", len(heard))
            heard += data
            self.gate.check_opening(heard)
            if len(heard) < self.gate.size:
                return  # more is due
            peer = self.gate.admit(bytes(heard))
        except BlockingIOError:
            return
        except OSError as exc:  # HandshakeFailed among them
            watched.unregister(sock)
            del pending[sock]
            reason = exc.reason if isinstance(exc, handshake.HandshakeFailed) else "reset the connection"
            self.refuse(sock, f"no proof of the run's secret: it {reason}", len(heard))
            return
        watched.unregister(sock)
        del pending[sock]
        self._admitted(sock, peer)

    def _admitted(self, sock: socket.socket, peer: handshake.Admitted) -> None:
        """A peer that proved the secret: refuse a rank outside the world, else hand the link over."""
        src, epoch = HELLO.unpack(peer.hello)
        if src == self.rank or (self.world is not None and src >= self.world):
            claim = f"it claims to be rank {src}, which is not a peer in a world of {self.world}"
            self.refuse(sock, claim, 1)
            return
        sock.setblocking(True)
        sock.settimeout(self.guard_s)
        if not self._take(src, epoch, sock):
            sock.close()  # a link of an older epoch: stale, never read (routine after a restart)
            return
        with contextlib.suppress(OSError):
            sock.sendall(self.gate.welcome(peer))

    def close(self) -> None:
        """Stop listening; remove the unix socket (and a private folder). Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2.0)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        for listener in (self._tcp, self._unix):
            listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.unix_path)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
