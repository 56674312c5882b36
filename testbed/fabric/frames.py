"""The data plane's wire format: a frame is a fixed prefix, a JSON header and raw bytes.

The prefix is ``kind`` (1 byte), the header's length (4 bytes) and the
payload's length (8 bytes), big-endian. Nothing from the wire is unpickled,
and every length is checked against a limit before anything is allocated
for it: a peer, even one that proved the run's secret, cannot make a rank
allocate more than twice what it really sent.
"""

from __future__ import annotations

import json
import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# the kinds, named here too beside the format they are the first byte of
from testbed.fabric.frame_kinds import ABORT as ABORT
from testbed.fabric.frame_kinds import DATA as DATA
from testbed.fabric.frame_kinds import DROP as DROP
from testbed.fabric.frame_kinds import KINDS as KINDS
from testbed.fabric.frame_kinds import LANE as LANE
from testbed.fabric.frame_kinds import SETUP_FAIL as SETUP_FAIL

PREFIX = struct.Struct("!BIQ")  # kind, header length, payload length

#: The largest header a frame may announce (headers are a few hundred bytes of JSON).
MAX_HEADER = 1 << 20
#: The largest payload a frame may announce (far above any message of the testbed's workloads or
#: benchmarks); nothing is allocated for a frame before its lengths are checked against these.
MAX_PAYLOAD = 1 << 30
#: A payload not read into a buffer of its own size starts in this much memory, doubled as it fills.
FIRST_CHUNK = 4 << 20

Payload = bytearray | memoryview | np.ndarray
Frame = tuple[int, dict[str, Any], Payload]

#: The header key of a frame's link sequence number: such a frame (on a link under netem) may yet
#: be turned away by its receiver (a failed checksum, a duplicate), so it is never folded.
SEQ = "nseq"

#: A folded payload is read through a buffer of this many bytes: its piece is still in the CPU's
#: cache when the fold reads it (a whole 4 MiB chunk is not, with 1 MiB of L2 per core).
FOLD_PIECE = 512 << 10


@dataclass
class Fold:
    """Work on a payload piece by piece as it arrives, instead of after the whole of it has landed.

    ``apply(piece, offset)`` gets each piece of the payload (bytes from
    ``offset`` on) in order; ``piece`` is a view of ``buffer`` (of
    :data:`FOLD_PIECE` bytes), valid only during the call. ``done`` says the
    whole payload went through ``apply``; when it is False the payload was
    read whole instead (it had been kept aside, or it may yet be turned
    away), and the caller applies it itself.
    """

    apply: Callable[[memoryview, int], None]
    buffer: memoryview
    done: bool = False


#: one encoder for every header: ``json.dumps`` with options builds a new encoder on each call
_HEADER_JSON = json.JSONEncoder(separators=(",", ":")).encode


def encode_head(kind: int, header: dict[str, Any], payload_bytes: int) -> bytes:
    """A frame's prefix and header, ready to send ahead of its payload."""
    head = _HEADER_JSON(header).encode()
    return PREFIX.pack(kind, len(head), payload_bytes) + head


def readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has bytes to read (or its end) within ``timeout_s``: ``poll``, not ``select``,
    which fails on descriptors past 1023 (a rank of a large world holds hundreds of links)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000) + (timeout_s > 0))))


def recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    """Exactly ``n`` bytes from ``sock``; None on end of stream."""
    buf = bytearray(n)
    return buf if recv_into(sock, memoryview(buf)) else None


def recv_into(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from the socket; False on end of stream."""
    n, got = len(view), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            return False
        got += k
    return True


def fold_payload(sock: socket.socket, n: int, fold: Fold) -> bool:
    """Read an ``n``-byte payload through ``fold.buffer``, handing each piece to ``fold.apply`` as it
    lands; False on end of stream (some pieces may have been applied)."""
    got, size = 0, len(fold.buffer)
    while got < n:
        piece = fold.buffer[: min(size, n - got)]
        if not recv_into(sock, piece):
            return False
        fold.apply(piece, got)
        got += len(piece)
    fold.done = True
    return True


def read_payload(
    sock: socket.socket, n: int, into: memoryview | None, fold: Fold | None = None
) -> Payload | None:
    """Read an ``n``-byte payload into ``into`` when it fits exactly (through ``fold`` instead, when
    given: ``into`` is then returned untouched, as the payload's stand-in), else into fresh memory
    that grows (doubling) as the bytes arrive: a frame that announces more than it sends never gets
    more than twice what it sent, whatever its header said. None on end of stream."""
    if into is not None and len(into) == n:
        if fold is not None:
            return into if fold_payload(sock, n, fold) else None
        return into if recv_into(sock, into) else None
    buf = np.empty(min(n, FIRST_CHUNK), dtype=np.uint8)  # not zero-filled, unlike bytearray
    got = 0
    while True:
        if not recv_into(sock, buf.data[got:]):
            return None
        got = len(buf)
        if got == n:
            return buf
        grown = np.empty(min(n, 2 * got), dtype=np.uint8)
        grown[:got] = buf
        buf = grown


def bad_prefix(kind: int, hlen: int, plen: int) -> str | None:
    """What is wrong with a frame's prefix, or None when it may be read."""
    if kind not in KINDS:
        return f"a frame of unknown kind {kind}"
    if hlen > MAX_HEADER:
        return f"a frame announcing a {hlen}-byte header (the limit is {MAX_HEADER})"
    if plen > MAX_PAYLOAD:
        return f"a frame announcing a {plen}-byte payload (the limit is {MAX_PAYLOAD})"
    return None


def parse_header(head: bytearray) -> dict[str, Any] | None:
    """A frame's header: a JSON object with a string ``tag``, or None."""
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or not isinstance(header.get("tag"), str):
        return None
    return header
