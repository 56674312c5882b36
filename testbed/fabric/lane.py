"""A link's shared-memory lane: large payloads between two processes on one host, copied once.

Over a unix socket a payload is copied twice, into the kernel and out of it,
and at megabytes those copies are most of a collective's time on a few cores
(the kernel's share of the CPU passes 60 % in a 32 MiB allreduce over 8
ranks). A link between processes on one host therefore carries its large
payloads in a lane instead: memory the sender shares with the receiver.

- The lane is a sealed ``memfd`` (it can neither shrink nor grow, so the
  receiver's mapping can never fault), passed once over the link's
  authenticated unix socket in the ancillary data of a ``LANE`` frame. Its
  pages exist only once written, and it is reused from its start whenever
  the receiver has freed all of it, so it holds about one payload.
- The sender copies a payload into the lane and sends its frame with the
  payload's place (:data:`PLACE`: offset, length, and the lane's running
  total at its end) and no bytes of its own; the receiver folds or copies
  it straight out of the lane and then frees it, sending that running total
  back on the socket (8 bytes).
- The sender never waits for room: a payload that does not fit in what is
  free goes over the socket as before, so the lane adds no wait that a slow
  or dead receiver could make hang. A payload its receiver may still turn
  away (:data:`~testbed.fabric.frames.SEQ`) never uses it.
- The receiver maps the lane read-only, checks every place against its size
  (a bad place fails the link as a malformed frame), and frees a place only
  once its bytes have left it, so no view of the lane outlives its turn.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import stat
import struct

from testbed.fabric.frames import (
    LANE,
    PREFIX,
    Fold,
    Payload,
    encode_head,
    parse_header,
    readable,
    recv_exact,
)

#: A lane's size: the most it holds at once (pages are only made as they are written).
LANE_BYTES = 64 << 20
#: Payloads from this size on take the lane; smaller ones cost less over the socket.
LANE_MIN = 256 << 10
#: The largest lane a receiver maps.
MAX_LANE = 1 << 30
#: The header key of a payload's place in the lane: ``[offset, length, end]``.
PLACE = "lane"
#: What a receiver sends back: the lane's running total it has freed up to.
FREED = struct.Struct("!Q")
#: The seals a lane must carry before a receiver maps it.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SendLane:
    """The sending end of a lane: its memory, and how much of it the receiver has freed."""

    def __init__(self, size: int = LANE_BYTES) -> None:
        self.fd = os.memfd_create("testbed-lane", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
            self.mem = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.size = size
        self.head = 0  # bytes placed since the lane opened, skips to its start included
        self.freed = 0  # the running total the receiver has freed up to
        self._freed_bytes = bytearray()

    def announce(self, sock: socket.socket) -> None:
        """Pass the lane to the receiver: a ``LANE`` frame carrying its descriptor, closed here then
        (the mapping keeps the memory; a process of a large world holds hundreds of links)."""
        head = encode_head(LANE, {"tag": "", "bytes": self.size}, 0)
        sock.sendall(head[: PREFIX.size])
        socket.send_fds(sock, [head[PREFIX.size :]], [self.fd])
        os.close(self.fd)
        self.fd = -1

    def place(self, sock: socket.socket, payload: bytes | memoryview) -> list[int] | None:
        """Copy ``payload`` into the lane; its place (for the frame's header), or None if it does not
        fit in what the receiver has freed."""
        self._take_freed(sock)
        n = len(payload)
        if self.head == self.freed:  # all of it free: start again at its start, on the pages made
            self.head = self.freed = -(-self.head // self.size) * self.size
        pos = self.head % self.size
        skip = self.size - pos if pos + n > self.size else 0
        if self.head - self.freed + skip + n > self.size:
            return None
        offset = 0 if skip else pos
        self.head += skip + n
        with memoryview(self.mem) as view:
            view[offset : offset + n] = payload
        return [offset, n, self.head]

    def _take_freed(self, sock: socket.socket) -> None:
        """Read what the receiver has freed, without waiting."""
        while readable(sock, 0.0):
            got = sock.recv(4096)
            if not got:
                break
            self._freed_bytes += got
        whole = len(self._freed_bytes) // FREED.size * FREED.size
        if whole:
            self.freed = max(self.freed, FREED.unpack_from(self._freed_bytes, whole - FREED.size)[0])
            del self._freed_bytes[:whole]

    def close(self) -> None:
        """Unmap the lane and close its descriptor."""
        with contextlib.suppress(BufferError, ValueError):
            self.mem.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def open_lane(sock: socket.socket) -> SendLane | None:
    """A lane passed to the receiver at the other end of ``sock``; None where there can be none (a
    TCP link, no ``memfd`` on this system) or the socket failed before the receiver got it."""
    if sock.family != socket.AF_UNIX:
        return None
    try:
        lane = SendLane()
    except OSError:
        return None
    try:
        lane.announce(sock)
    except OSError:
        lane.close()
        return None
    return lane


class ReceiveLane:
    """The receiving end of a lane: the sender's memory, mapped read-only."""

    def __init__(self, fd: int) -> None:
        try:
            info = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            if not stat.S_ISREG(info.st_mode) or not 0 < info.st_size <= MAX_LANE or seals & SEALS != SEALS:
                raise ValueError(f"a lane of {info.st_size} bytes, seals {seals:#x}")
            self.mem = mmap.mmap(fd, info.st_size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.size = info.st_size

    def take(
        self, sock: socket.socket, place: object, into: memoryview | None, fold: Fold | None
    ) -> Payload | None:
        """The payload at ``place``: folded (``fold``) or copied into ``into`` when it fits it exactly,
        else copied out; then freed. None for a place outside the lane; ``ConnectionResetError`` (as a
        closed socket) once the lane is unmapped."""
        if not (isinstance(place, list) and len(place) == 3 and all(isinstance(v, int) for v in place)):
            return None
        offset, n, end = place
        if not (offset >= 0 and n >= 0 and offset + n <= self.size):
            return None
        try:
            whole = memoryview(self.mem)
        except ValueError:  # unmapped: the link closed under this read
            raise ConnectionResetError("the link's lane is closed") from None
        with whole as lane:
            view = lane[offset : offset + n]
            if into is not None and len(into) == n:
                if fold is not None:
                    fold_view(view, fold)
                else:
                    into[:] = view
                payload: Payload = into
            else:
                payload = bytearray(view)
            view.release()
        with contextlib.suppress(OSError):
            sock.send(FREED.pack(end))
        return payload

    def close(self) -> None:
        """Unmap the lane."""
        with contextlib.suppress(BufferError, ValueError):
            self.mem.close()


def fold_view(view: memoryview, fold: Fold) -> None:
    """Hand ``view`` to ``fold`` in pieces of its buffer's size (no copy: the pieces are views)."""
    size = len(fold.buffer)
    for start in range(0, len(view), size):
        fold.apply(view[start : start + size], start)
    fold.done = True


def receive_lane(sock: socket.socket, hlen: int) -> tuple[dict[str, object] | None, ReceiveLane | None]:
    """Read a ``LANE`` frame's header and the descriptor it carries (after its prefix): the header and
    the lane, or what could be read and None when the descriptor is not a lane."""
    head, fds, _, _ = socket.recv_fds(sock, hlen, 4)
    rest = recv_exact(sock, hlen - len(head)) if len(head) < hlen else b""
    header = parse_header(bytearray(head) + (rest or b"")) if rest is not None else None
    for extra in fds[1:]:
        os.close(extra)
    if header is None or len(fds) != 1:
        if fds:
            os.close(fds[0])
        return header, None
    try:
        return header, ReceiveLane(fds[0])
    except (OSError, ValueError):
        return header, None


class Lanes:
    """The lanes a rank receives on, one per peer (with the socket that passed it)."""

    def __init__(self) -> None:
        self._by_peer: dict[int, tuple[socket.socket, ReceiveLane]] = {}

    def open(self, src: int, sock: socket.socket, hlen: int) -> str | None:
        """Map the lane a ``LANE`` frame from ``src`` carries (its prefix read); what is wrong, or None."""
        _, lane = receive_lane(sock, hlen)
        if lane is None:
            return "a lane frame without a sealed shared-memory descriptor"
        self.drop(src)
        self._by_peer[src] = (sock, lane)
        return None

    def take(
        self, src: int, sock: socket.socket, place: object, into: memoryview | None, fold: Fold | None
    ) -> Payload | str:
        """The payload ``src`` placed at ``place`` in its lane (see :meth:`ReceiveLane.take`), or what
        is wrong with it."""
        held = self._by_peer.get(src)
        if held is None or held[0] is not sock:
            return "a payload in a lane it never passed"
        got = held[1].take(sock, place, into, fold)
        return "a payload placed outside its lane" if got is None else got

    def drop(self, src: int) -> None:
        """Unmap ``src``'s lane (its link is closed)."""
        held = self._by_peer.pop(src, None)
        if held is not None:
            held[1].close()

    def keep(self, open_sockets: set[int]) -> None:
        """Unmap every lane whose socket is not one of ``open_sockets`` (by ``id``)."""
        for src in [s for s, (sock, _) in self._by_peer.items() if id(sock) not in open_sockets]:
            self.drop(src)
