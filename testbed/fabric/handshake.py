"""Mutual authentication of a new connection: an HMAC challenge on the run's secret.

Every listener of a run (an NPU's data plane, a supernode's relay lines)
speaks first: it sends a fresh random challenge. The connecting peer answers
with its hello (who it is) and an HMAC-SHA256 over the listener's challenge,
a challenge of its own and that hello; the listener checks it in constant
time before it reads a single frame, and answers with an HMAC over the
peer's challenge, which the peer checks in turn. It is what
``multiprocessing``'s authkey does, in both directions, with the listener's
purpose bound into every proof (a proof for one kind of listener is no proof
for another) and with nothing unpickled. A stranger who does not hold the
secret cannot pass it, and a recorded exchange cannot be replayed: each
challenge is new. The secret itself never crosses the wire.

Wire format (all sizes fixed, so a message cannot be mis-split)::

    listener -> peer:  "TBAU" version:1 challenge:32
    peer -> listener:  "TBHI" challenge:32 hello:N proof:32
    listener -> peer:  "K" proof:32
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass

from testbed.core.secret import RunSecret

VERSION = 1
_CHALLENGE = struct.Struct("!4sB32s")  # magic, version, the listener's challenge
_ANSWER_MAGIC = b"TBHI"
NONCE = 32
PROOF = 32
_WELCOME = b"K"

#: wall seconds a listener gives a new peer to prove itself (peers are the run's own processes: they
#: answer in microseconds; a silent stranger is dropped after this)
HANDSHAKE_S = 10.0


class HandshakeFailed(ConnectionError):
    """A connection whose other side did not prove it holds the run's secret (or spoke another
    protocol). ``heard`` is how many bytes it sent before the handshake failed."""

    def __init__(self, reason: str, heard: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.heard = heard


@dataclass(frozen=True)
class Admitted:
    """A peer that proved itself to a listener: what it said it is, and the two challenges."""

    hello: bytes
    ours: bytes
    theirs: bytes


def _proof(
    secret: RunSecret, role: bytes, purpose: bytes, first: bytes, second: bytes, hello: bytes
) -> bytes:
    msg = role + b"\0" + purpose + b"\0" + first + second + hello
    return hmac.new(secret.key, msg, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, heard: int = 0) -> bytes:
    """Exactly ``n`` bytes, or :class:`HandshakeFailed` (with what was heard so far)."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise HandshakeFailed(f"said {heard + len(buf)} bytes, then nothing", heard + len(buf)) from None
        if not chunk:
            raise HandshakeFailed(f"closed after {heard + len(buf)} bytes of the handshake", heard + len(buf))
        buf += chunk
    return bytes(buf)


def admit(sock: socket.socket, secret: RunSecret, purpose: bytes, hello_size: int) -> Admitted:
    """Listener side: challenge the peer on ``sock`` and check its answer (its ``hello_size``-byte
    hello and its proof). Raises :class:`HandshakeFailed` unless the proof is right. The caller has
    set the socket's timeout; nothing of the peer's is interpreted before the proof is checked."""
    ours = os.urandom(NONCE)
    sock.sendall(_CHALLENGE.pack(b"TBAU", VERSION, ours))
    magic = _read(sock, len(_ANSWER_MAGIC))
    if magic != _ANSWER_MAGIC:
        raise HandshakeFailed(f"opened with {magic!r}, not a testbed hello", len(magic))
    rest = _read(sock, NONCE + hello_size + PROOF, len(magic))
    theirs, hello, proof = rest[:NONCE], rest[NONCE:-PROOF], rest[-PROOF:]
    if not hmac.compare_digest(proof, _proof(secret, b"peer", purpose, ours, theirs, hello)):
        raise HandshakeFailed("its proof of the run's secret is wrong", len(magic) + len(rest))
    return Admitted(hello, ours, theirs)


def welcome(sock: socket.socket, secret: RunSecret, purpose: bytes, peer: Admitted) -> None:
    """Listener side, once the peer is registered: prove the listener holds the secret too."""
    sock.sendall(_WELCOME + _proof(secret, b"listener", purpose, peer.theirs, peer.ours, peer.hello))


def introduce(sock: socket.socket, secret: RunSecret, purpose: bytes, hello: bytes) -> None:
    """Peer side: answer the listener's challenge with ``hello`` and a proof, then check the
    listener's proof. Raises :class:`HandshakeFailed` (an ``OSError``) when the listener is not
    the run's, or refused the peer."""
    raw = _read(sock, _CHALLENGE.size)
    magic, version, challenge = _CHALLENGE.unpack(raw)
    if magic != b"TBAU" or version != VERSION:
        raise HandshakeFailed(f"the listener is not a testbed listener of version {VERSION}")
    ours = os.urandom(NONCE)
    sock.sendall(_ANSWER_MAGIC + ours + hello + _proof(secret, b"peer", purpose, challenge, ours, hello))
    answer = _read(sock, len(_WELCOME) + PROOF)
    expected = _proof(secret, b"listener", purpose, ours, challenge, hello)
    if answer[:1] != _WELCOME or not hmac.compare_digest(answer[1:], expected):
        raise HandshakeFailed("the listener did not prove it holds the run's secret")


def peer_name(sock: socket.socket) -> str:
    """Who is on the other end of ``sock``: ``host:port`` for TCP; the process, user and group ids
    the kernel vouches for (SO_PEERCRED) on a unix socket."""
    if sock.family == socket.AF_UNIX:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except (OSError, AttributeError):
            return "a unix-socket peer"
        pid, uid, gid = struct.unpack("3i", creds)
        return f"pid {pid} (uid {uid}, gid {gid}) on the unix socket"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a peer that has gone"
    return f"{host}:{port}"
