"""Mutual authentication of a new connection: an HMAC proof of the run's secret, both ways.

Every listener of a run (an NPU's data plane, a supernode's relay lines) has
a gate with a challenge of its own, 32 random bytes drawn when it starts and
published with its address through the control plane, as the address itself
is. A connecting peer speaks first: its hello (who it is), a fresh challenge
of its own, and an HMAC-SHA256 of the secret over the listener's challenge,
its own and the hello. The gate checks the proof in constant time before it
reads a single frame, refuses a peer challenge it has already seen (a
recorded hello cannot be replayed), and answers with an HMAC over the peer's
fresh challenge, which the peer checks in turn. It is what
``multiprocessing``'s authkey does, in both directions, in one round trip
(as many as the hello and its acknowledgement always took: a 384-NPU job
opens tens of thousands of links), with the kind of listener bound into
every proof (a proof for one kind is no proof for another) and with nothing
unpickled. The secret itself never crosses the wire.

Wire format (all sizes fixed, so a message cannot be mis-split)::

    peer -> listener:  "TBHI" version:1 challenge:32 hello:N proof:32
    listener -> peer:  "K" proof:32
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
from dataclasses import dataclass

from testbed.core.secret import RunSecret

VERSION = 1
_OPENING = b"TBHI" + bytes([VERSION])
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
    """A peer that proved itself to a listener: what it said it is, and its challenge."""

    hello: bytes
    theirs: bytes


def _proof(
    secret: RunSecret, role: bytes, purpose: bytes, first: bytes, second: bytes, hello: bytes
) -> bytes:
    """HMAC-SHA256 of the run's secret over who proves (``role``), to which kind of listener, the
    two challenges (in the prover's order) and the hello."""
    msg = role + b"\0" + purpose + b"\0" + first + second + hello
    return hmac.new(secret.key, msg, hashlib.sha256).digest()


class Gate:
    """A listener's side of the handshake: its published challenge, and every peer challenge it has
    admitted (a hello is good once)."""

    def __init__(self, secret: RunSecret, purpose: bytes, hello_size: int) -> None:
        self.challenge = os.urandom(NONCE)
        self.size = len(_OPENING) + NONCE + hello_size + PROOF  # a whole answer
        self._secret, self._purpose = secret, purpose
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def check_opening(self, heard: bytes | bytearray) -> None:
        """Fail as soon as what the peer has said so far cannot begin an answer."""
        if len(heard) > self.size:  # a peer waits for the welcome before it sends a frame
            raise HandshakeFailed(f"sent {len(heard)} bytes where a hello has {self.size}", len(heard))
        opening = bytes(heard[: len(_OPENING)])
        if not _OPENING.startswith(opening):
            raise HandshakeFailed(f"opened with {opening!r}, not a testbed hello", len(heard))

    def admit(self, answer: bytes) -> Admitted:
        """The peer of a whole ``answer``, if its proof is right and its challenge new."""
        self.check_opening(answer)
        rest = answer[len(_OPENING) :]
        theirs, hello, proof = rest[:NONCE], rest[NONCE:-PROOF], rest[-PROOF:]
        expected = _proof(self._secret, b"peer", self._purpose, self.challenge, theirs, hello)
        if not hmac.compare_digest(proof, expected):
            raise HandshakeFailed("its proof of the run's secret is wrong", len(answer))
        with self._lock:
            if theirs in self._seen:
                raise HandshakeFailed("replayed a hello this listener already admitted", len(answer))
            self._seen.add(theirs)
        return Admitted(hello, theirs)

    def welcome(self, peer: Admitted) -> bytes:
        """What the listener answers an admitted peer: its own proof, over the peer's challenge."""
        return _WELCOME + _proof(
            self._secret, b"listener", self._purpose, peer.theirs, self.challenge, peer.hello
        )


def admit(sock: socket.socket, gate: Gate) -> Admitted:
    """Listener side, blocking: read the peer's answer on ``sock`` and check it (the caller has set
    the socket's timeout). Raises :class:`HandshakeFailed` unless the peer proved itself."""
    heard = bytearray()
    while len(heard) < gate.size:
        try:
            chunk = sock.recv(gate.size - len(heard))
        except TimeoutError:
            raise HandshakeFailed(f"said {len(heard)} bytes, then nothing", len(heard)) from None
        if not chunk:
            raise HandshakeFailed(f"closed after {len(heard)} bytes of the handshake", len(heard))
        heard += chunk
        gate.check_opening(heard)
    return gate.admit(bytes(heard))


def introduce(sock: socket.socket, secret: RunSecret, purpose: bytes, challenge: bytes, hello: bytes) -> None:
    """Peer side: prove the secret to the listener whose published challenge is ``challenge``, saying
    ``hello``, then check the listener's proof. Raises :class:`HandshakeFailed` (an ``OSError``)
    when the listener is not the run's, or refused the peer."""
    ours = os.urandom(NONCE)
    sock.sendall(_OPENING + ours + hello + _proof(secret, b"peer", purpose, challenge, ours, hello))
    answer = bytearray()
    while len(answer) < len(_WELCOME) + PROOF:
        chunk = sock.recv(len(_WELCOME) + PROOF - len(answer))
        if not chunk:
            raise HandshakeFailed("the listener closed the connection: it refused this peer")
        answer += chunk
    expected = _proof(secret, b"listener", purpose, ours, challenge, hello)
    if answer[:1] != _WELCOME or not hmac.compare_digest(bytes(answer[1:]), expected):
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
