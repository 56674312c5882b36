"""The data plane: sockets directly between NPU actor processes.

Ray is only the control plane; a collective made of Ray actor calls costs
milliseconds per hop here, a socket between the actors a small fraction of
that. Every NPU listens on a TCP port (127.0.0.1 unless told otherwise: on a
multi-node Ray cluster, its Ray node's address) and on a unix socket; peers on
the same host and address (the same Ray node) use the unix socket (no TCP/IP
stack), peers elsewhere the TCP port.

- Every listener authenticates a peer before it reads a frame from it: it
  challenges the peer to prove it holds the run's secret, and proves it too
  (:mod:`testbed.fabric.handshake`). A peer that fails is dropped and
  reported (:attr:`DataPlane.on_refused`). Frames are data (a JSON header and
  raw bytes), never pickles; every length is bounded before anything is
  allocated, and a frame that breaks the format fails its link with a
  :class:`~testbed.core.errors.FrameError` naming the peer and the fault.
- Unix sockets live in a folder only the run's user can enter (0700).
- Links connect lazily: the first frame to a peer opens one connection,
  introduced by a hello (sender rank, group epoch) inside the handshake that
  the receiver acknowledges once the socket is registered. So "sent" implies
  "the receiver can see it", which makes a peer's death observable
  deterministically.
- A new epoch (after a restart) drops every connection of the old one, so
  stale bytes from an aborted collective can never be read as new data.
- Frames carry a tag (group and collective sequence); a receiver waiting for
  one tag keeps frames of other tags aside, so several groups can be alive at
  once over the same links.
- Small frames (up to 64 KiB) go out from the caller's thread when nothing
  is queued ahead of them on that link (they fit in the socket buffer).
  Larger ones are queued to the link's drain (:mod:`testbed.fabric.link_sender`,
  a few threads shared by the rank's links), so a ring where every rank
  sends before it receives cannot deadlock on full socket buffers.
- Between processes on one host, payloads of 256 KiB and more travel in a
  shared-memory lane beside the socket, copied once rather than twice
  (:mod:`testbed.fabric.lane`).
- Every blocking wait has a wall-clock guard that raises :class:`HarnessHang`.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from testbed.core.errors import FrameError, HarnessHang
from testbed.core.secret import RunSecret
from testbed.fabric.frames import (
    ABORT,
    DATA,
    DROP,
    KINDS,
    LANE,
    PREFIX,
    SEQ,
    SETUP_FAIL,
    Fold,
    Frame,
    Payload,
    bad_prefix,
    parse_header,
    read_payload,
    readable,
    recv_exact,
)
from testbed.fabric.lane import PLACE, Lanes
from testbed.fabric.link_sender import LinkSender, link_opener, link_pool, tune
from testbed.fabric.listeners import HELLO, Listeners, Refusal

__all__ = ["ABORT", "DATA", "DROP", "KINDS", "SETUP_FAIL", "DataPlane", "Fold", "PeerClosed"]


class PeerClosed(Exception):
    """Nothing more will ever come from ``src``: its process is gone (internal to the testbed)."""

    def __init__(self, src: int) -> None:
        super().__init__(src)
        self.src = src


class DataPlane:
    """The sockets of one rank: a listener, its inbound links and its outbound links.

    ``secret`` is the run's: a peer must prove it holds it. ``world`` (when
    known) bounds the ranks a peer may claim to be. ``on_refused`` is told of
    every peer refused (a failed proof, a bogus rank, a malformed frame).
    """

    def __init__(
        self,
        rank: int,
        secret: RunSecret,
        host: str = "127.0.0.1",
        guard_s: float = 60.0,
        socket_dir: str | None = None,
        world: int | None = None,
    ) -> None:
        self.rank = rank
        self.secret = secret
        self.world = world
        self.guard_s = guard_s
        self.epoch = 0
        self.addresses: dict[int, tuple[Any, ...]] = {}
        #: told of each refused peer; by default kept in :attr:`refused`
        self.on_refused: Callable[[Refusal], None] = self.refused_append
        self.refused: list[Refusal] = []
        self._machine = f"{socket.gethostname()}/{host}"  # peers with the same one use the unix socket
        self._inbox: dict[int, tuple[int, socket.socket]] = {}
        self._stash: dict[tuple[int, str], collections.deque[Frame]] = collections.defaultdict(
            collections.deque
        )
        self._senders: dict[int, LinkSender] = {}
        self._pool = link_pool()
        self._dead: set[int] = set()
        #: delivers markers to peers without a link (src, epoch, peers, kind, header); None: open links
        self.relay: Callable[[int, int, list[int], int, dict[str, Any]], None] | None = None
        self._early: list[tuple[int, int, int, dict[str, Any]]] = []  # relayed markers of a later epoch
        self._failed: dict[int, FrameError] = {}  # src -> why its link failed (this epoch)
        self._lanes = Lanes()  # the shared memory of peers on this host (:mod:`testbed.fabric.lane`)
        self._queued = False  # a frame went to a sender thread since the last flush
        self._cond = threading.Condition()
        self._closed = False
        # Peers on this host connect through the unix socket: no TCP/IP stack. Peers elsewhere use
        # the TCP listener. Both authenticate every peer first.
        self._listeners = Listeners(
            rank, secret, host, socket_dir, world, guard_s, self._take, lambda r: self.on_refused(r)
        )

    @property
    def address(self) -> tuple[str, int, str, str, str]:
        """(host, port, unix socket path, machine and address, the listeners' challenge in hex): where
        peers connect, and what they prove themselves against."""
        host, port = self._listeners.tcp_address
        return host, port, self._listeners.unix_path, self._machine, self._listeners.gate.challenge.hex()

    # --- inbound -------------------------------------------------------------
    def refused_append(self, refusal: Refusal) -> None:
        """Keep ``refusal`` in :attr:`refused` (the default :attr:`on_refused`)."""
        with self._cond:
            self.refused.append(refusal)

    def _take(self, src: int, epoch: int, sock: socket.socket) -> bool:
        """Register an authenticated link from ``src`` of group ``epoch``; False if it is stale."""
        tune(sock, socket.SO_RCVBUF)
        with self._cond:
            old = self._inbox.get(src)
            if epoch < self.epoch or (old is not None and old[0] > epoch):
                return False
            if old is not None:
                old[1].close()
            self._inbox[src] = (epoch, sock)
            self._cond.notify_all()
        return True

    def new_epoch(self, epoch: int, addresses: dict[int, tuple[Any, ...]]) -> None:
        """Drop every link of older epochs and every kept frame; peers are now at ``addresses``."""
        for sender in self._senders.values():
            sender.close()
        self._senders = {}
        with self._cond:
            self.epoch = epoch
            self.addresses = dict(addresses)
            self._dead.clear()
            self._failed.clear()
            self._stash.clear()
            early, self._early = self._early, []
            for src, ep, kind, header in early:
                if ep == epoch:
                    self._stash[(src, str(header.get("tag")))].append((kind, header, bytearray()))
                elif ep > epoch:
                    self._early.append((src, ep, kind, header))
            for src, (ep, sock) in list(self._inbox.items()):
                if ep < epoch:
                    sock.close()
                    del self._inbox[src]
            self._lanes.keep({id(sock) for _, sock in self._inbox.values()})

    def mark_dead(self, rank: int, address: Sequence[Any] | None = None) -> None:
        """``rank``'s process (the one listening at ``address``, if given) is gone: a wait on a link it
        never opened ends now.

        The news travels through the supernodes and may arrive after the rank's
        replacement joined a newer epoch: a death of a process that no longer
        holds ``rank`` here is ignored, or the first wait on the new process
        would end as if it had died.
        """
        with self._cond:
            held = self.addresses.get(rank)
            if address is not None and held is not None and tuple(held) != tuple(address):
                return
            self._dead.add(rank)
            self._cond.notify_all()

    def _socket_from(self, src: int, deadline: float, keys: list[tuple[int, str]]) -> socket.socket | None:
        """The link from ``src``, once open; None as soon as a frame of ``keys`` is kept instead."""
        with self._cond:
            while True:
                entry = self._inbox.get(src)
                if entry is not None and entry[0] == self.epoch:
                    return entry[1]
                if any(self._stash.get(k) for k in keys):
                    return None
                if src in self._failed:
                    raise self._failed[src]
                if src in self._dead or self._closed:
                    raise PeerClosed(src)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._hang(src)
                self._cond.wait(min(left, 1.0))

    def _hang(self, src: int) -> HarnessHang:
        return HarnessHang(
            f"rank {self.rank}: nothing from rank {src} for {self.guard_s:.0f} s of wall time; the "
            "testbed itself is stuck (a modelled timeout would have fired in virtual time)",
            rank=self.rank,
            peer=src,
        )

    def _read_frame(
        self,
        src: int,
        sock: socket.socket,
        deadline: float,
        tag: str,
        into: memoryview | None,
        fold: Fold | None = None,
    ) -> Frame:
        left = deadline - time.monotonic()
        try:
            if not readable(sock, left):
                raise self._hang(src)
            raw = recv_exact(sock, PREFIX.size)
            if raw is None:
                raise PeerClosed(src)
            kind, hlen, plen = PREFIX.unpack(raw)
            wrong = bad_prefix(kind, hlen, plen) or (kind == LANE and self._lanes.open(src, sock, hlen))
            if wrong:
                raise self._malformed(src, sock, wrong)
            if kind == LANE:  # the link has a lane from now on; the frame to read comes next
                return self._read_frame(src, sock, deadline, tag, into, fold)
            head = recv_exact(sock, hlen)
            if head is None:
                raise PeerClosed(src)
            header = parse_header(head)
            if header is None:
                raise self._malformed(src, sock, f"a {hlen}-byte header that is not a JSON object with a tag")
            mine = header["tag"] == tag
            fold = fold if mine and SEQ not in header else None
            payload: Payload | str | None
            if PLACE in header:
                payload = self._lanes.take(src, sock, header[PLACE], into if mine else None, fold)
            else:
                payload = read_payload(sock, plen, into if mine else None, fold) if plen else bytearray()
            if isinstance(payload, str):
                raise self._malformed(src, sock, payload)
        except TimeoutError as exc:
            raise self._hang(src) from exc
        except OSError as exc:  # reset by a dead peer, or closed under us
            raise PeerClosed(src) from exc
        if payload is None:
            raise PeerClosed(src)
        return kind, header, payload

    def _malformed(self, src: int, sock: socket.socket, what: str) -> FrameError:
        """Fail the link from ``src``: it sent ``what``. Later waits on ``src`` this epoch fail alike."""
        listener = f"data plane of rank {self.rank}"
        err = FrameError(
            f"rank {self.rank}: the link from rank {src} is failed: it sent {what}; a peer of this run "
            "sent bytes outside the data plane's format (a testbed bug, or a process writing to the "
            "socket that is not the testbed's)",
            rank=self.rank,
            peer=src,
            listener=listener,
        )
        self.on_refused(
            {"listener": listener, "peer": f"rank {src}", "reason": f"it sent {what}", "heard": 1}
        )
        with self._cond:
            self._failed[src] = err
            entry = self._inbox.get(src)
            if entry is not None and entry[1] is sock:
                del self._inbox[src]
        with contextlib.suppress(OSError):
            sock.close()
        return err

    def recv(
        self,
        src: int,
        tag: str,
        into: memoryview | None = None,
        also: str | None = None,
        fold: Fold | None = None,
    ) -> Frame:
        """The next frame from ``src`` with ``tag`` (or ``also``); frames of other tags are kept for later.

        A payload of exactly ``len(into)`` bytes is read straight into ``into``
        (no copy); the frame then carries ``into`` as its payload. With
        ``fold``, such a payload arriving now goes through the fold piece by
        piece instead (``into`` stays untouched; ``fold.done`` says so), unless
        its receiver may yet turn it away (:data:`~testbed.fabric.frames.SEQ`).
        ``also`` is
        the tag of a job-wide abort, which ends any wait on ``src``. Raises
        :class:`PeerClosed` when ``src`` is gone and nothing more can come.
        """
        deadline = time.monotonic() + self.guard_s
        while True:  # a marker relayed by the control plane lands in the stash while this waits
            kept = self._kept(src, tag, into, also)
            if kept is not None:
                return kept
            keys: list[tuple[int, str]] = [(src, tag)] if also is None else [(src, tag), (src, also)]
            sock = self._socket_from(src, deadline, keys)
            if sock is not None:
                break
        while True:
            frame = self._read_frame(src, sock, deadline, tag, into, fold)
            got = frame[1].get("tag")
            if got == tag or (also is not None and got == also):
                return frame
            self._stash[(src, str(got))].append(frame)

    def _kept(self, src: int, tag: str, into: memoryview | None, also: str | None) -> Frame | None:
        """A frame from ``src`` with ``tag`` (or ``also``) kept earlier, or None."""
        with self._cond:
            for wanted in (tag, also):
                kept = self._stash.get((src, wanted)) if wanted is not None else None
                if kept:
                    kind, header, payload = kept.popleft()
                    if into is not None and len(payload) == len(into) and wanted == tag:
                        view = payload.data if isinstance(payload, np.ndarray) else memoryview(payload)
                        into[:] = view.cast("B")
                        return kind, header, into
                    return kind, header, payload
        return None

    def discard_kept(self, src: int, reject: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Remove the frames kept from ``src`` whose header ``reject`` turns away; their headers."""
        gone: list[dict[str, Any]] = []
        with self._cond:
            for key in [k for k in self._stash if k[0] == src]:
                kept = self._stash[key]
                gone += [h for _, h, _ in kept if reject(h)]
                self._stash[key] = collections.deque(f for f in kept if not reject(f[1]))
        return gone

    def deliver(self, markers: list[tuple[int, int, int, dict[str, Any]]]) -> None:
        """Markers ``(src, epoch, kind, header)`` (aborts, drops) relayed by the control plane: each
        ``src`` had no link to this rank in ``epoch``, so nothing else of that epoch can come from it.
        One wake-up for the whole batch: an abort across a large world brings hundreds at once."""
        with self._cond:
            for src, epoch, kind, header in markers:
                if epoch > self.epoch:
                    self._early.append((src, epoch, kind, header))
                elif epoch == self.epoch:
                    self._stash[(src, str(header.get("tag")))].append((kind, header, bytearray()))
            self._cond.notify_all()

    # --- outbound ------------------------------------------------------------
    def send_markers(self, peers: list[int], kind: int, header: dict[str, Any]) -> None:
        """One marker frame to each of ``peers``. With a :attr:`relay`, a peer this rank has no link to
        gets its marker through the control plane: an abort to every rank of a 384-rank world would
        otherwise set up 383 links in each rank."""
        unlinked = [p for p in peers if p not in self._senders] if self.relay is not None else []
        for peer in peers:
            if peer not in unlinked:
                self.send(peer, kind, header)
        if unlinked and self.relay is not None:
            self.relay(self.rank, self.epoch, unlinked, kind, header)

    def send(self, dst: int, kind: int, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
        """Queue one frame to ``dst``; frames to one peer arrive in the order sent. The payload is not
        copied: the caller keeps the array unchanged until :meth:`flush`."""
        sender = self._senders.get(dst)
        if sender is None:
            hello = HELLO.pack(self.rank, self.epoch)
            opener = link_opener(self.addresses[dst], self._machine, self.guard_s, self.secret, hello)
            sender = self._senders[dst] = LinkSender(opener, dst, self._pool)
        if not sender.offer(kind, header, payload):
            self._queued = True

    def flush(self) -> None:
        """Wait until every queued frame is handed to the kernel (bounded by the guard).

        After this, the arrays whose memory was queued may change again.
        """
        if not self._queued:  # everything since the last flush went out inline
            return
        deadline = time.monotonic() + self.guard_s
        for dst, sender in self._senders.items():
            if not sender.flush(deadline):
                raise HarnessHang(
                    f"rank {self.rank}: frames to rank {dst} still queued after {self.guard_s:.0f} s",
                    rank=self.rank,
                    peer=dst,
                )
        self._queued = False

    def close(self) -> None:
        """Close every socket and stop the threads."""
        self._closed = True
        for sender in self._senders.values():
            sender.close()
        self._pool.shutdown(wait=False)
        with self._cond:
            for _, sock in self._inbox.values():
                sock.close()
            self._inbox.clear()
            self._lanes.keep(set())
            self._cond.notify_all()
        self._listeners.close()
