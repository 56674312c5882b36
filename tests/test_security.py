"""No one gets in: every listener of a run authenticates its peers before it reads a frame, nothing
from a socket is unpickled, and malformed frames from a peer that did authenticate fail one link
cleanly (never a hang, a crash of another rank, or an unbounded allocation)."""

from __future__ import annotations

import ast
import json
import os
import pickle
import socket
import stat
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.actors.relay_lines import MAX_BATCH, RelayLines, decode, encode
from testbed.core.errors import FrameError, TestbedError
from testbed.core.secret import RunSecret
from testbed.fabric import handshake
from testbed.fabric.dataplane import DataPlane, PeerClosed
from testbed.fabric.frames import DATA, LANE, MAX_HEADER, MAX_PAYLOAD, PREFIX
from testbed.fabric.listeners import HELLO


class Planted:
    """Unpickling this creates ``path``: proof that a listener ran a stranger's code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def attacks(marker: Path) -> list[bytes]:
    """What a stranger sends: a bare pickle, a pickle framed as multiprocessing frames it, and a
    data-plane frame forged in the format the data plane used before it authenticated peers."""
    payload = pickle.dumps(Planted(marker))
    forged_hello = b"TBDP" + struct.pack("!II", 0, 0)
    header = json.dumps({"tag": "w/1", "dtype": "float32", "shape": [1], "arrival": 0.0}).encode()
    forged = forged_hello + struct.pack("!BII", DATA, len(header), 4) + header + b"\0\0\0\0"
    return [payload, struct.pack("!i", len(payload)) + payload, forged]


def stranger(address: Any, data: bytes, wait_s: float = 5.0) -> bytes:
    """Connect to ``address`` (a TCP pair or a unix path), send ``data``, and read until the other
    side closes (or ``wait_s`` passes); returns what it said."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(wait_s)
        sock.connect(address)
        heard = bytearray()
        try:
            sock.sendall(data)
            while chunk := sock.recv(4096):
                heard += chunk
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
        return bytes(heard)


def test_the_planted_payload_would_run_if_anyone_unpickled_it(tmp_path: Path) -> None:
    pickle.loads(attacks(tmp_path / "ran")[0])  # the probe is live: unpickling it runs code
    assert (tmp_path / "ran").is_dir()


def test_a_run_secret_never_shows_itself_and_survives_pickling() -> None:
    secret = RunSecret.new()
    shown = repr(secret) + str(secret) + json.dumps({"s": secret}, default=str) + repr({"s": secret})
    assert secret.key.hex() not in shown and "hidden" in shown
    assert pickle.loads(pickle.dumps(secret)) == secret != RunSecret.new()


# --- the handshake ------------------------------------------------------------------------------------


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    return a, b


def _admit_in_thread(sock: socket.socket, gate: handshake.Gate) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def serve() -> None:
        try:
            peer = handshake.admit(sock, gate)
            sock.sendall(gate.welcome(peer))
            out["hello"] = peer.hello
        except handshake.HandshakeFailed as exc:
            out["refused"] = exc
            sock.close()  # as a listener drops a peer it refused

    thread = threading.Thread(target=serve)
    thread.start()
    out["thread"] = thread
    return out


def test_peers_that_share_the_secret_prove_it_to_each_other() -> None:
    secret = RunSecret.new()
    gate = handshake.Gate(secret, b"test", 4)
    listener, peer = _pair()
    got = _admit_in_thread(listener, gate)
    handshake.introduce(peer, secret, b"test", gate.challenge, b"abcd")
    got["thread"].join(5)
    assert got["hello"] == b"abcd"


def test_a_stranger_without_the_secret_is_refused_and_a_listener_without_it_is_not_trusted() -> None:
    gate = handshake.Gate(RunSecret.new(), b"test", 4)
    listener, peer = _pair()
    got = _admit_in_thread(listener, gate)
    with pytest.raises(handshake.HandshakeFailed, match="refused this peer"):
        handshake.introduce(peer, RunSecret.new(), b"test", gate.challenge, b"abcd")
    got["thread"].join(5)
    assert "proof of the run's secret is wrong" in str(got["refused"])
    # a listener of another run (or a stranger listening) cannot prove itself to a peer either
    fake, peer = _pair()
    threading.Timer(0.1, lambda: fake.sendall(b"K" + os.urandom(32))).start()
    with pytest.raises(handshake.HandshakeFailed, match="did not prove"):
        handshake.introduce(peer, RunSecret.new(), b"test", os.urandom(32), b"abcd")


def test_a_recorded_hello_cannot_be_replayed() -> None:
    secret = RunSecret.new()
    gate = handshake.Gate(secret, b"test", 4)
    listener, peer = _pair()
    got = _admit_in_thread(listener, gate)
    recorded = bytearray()

    class Recording:  # the peer's socket, with everything it sends recorded
        recv = peer.recv

        def sendall(self, data: bytes) -> None:
            recorded.extend(data)
            peer.sendall(data)

    handshake.introduce(Recording(), secret, b"test", gate.challenge, b"abcd")  # type: ignore[arg-type]
    got["thread"].join(5)
    assert got["hello"] == b"abcd"
    other = handshake.Gate(secret, b"test", 4)  # another listener: another challenge
    for target, why in ((gate, "replayed a hello"), (other, "proof of the run's secret is wrong")):
        listener2, replayer = _pair()
        again = _admit_in_thread(listener2, target)
        replayer.sendall(bytes(recorded))
        again["thread"].join(5)
        assert "hello" not in again and why in str(again["refused"])


def test_a_proof_for_one_kind_of_listener_is_no_proof_for_another() -> None:
    secret = RunSecret.new()
    gate = handshake.Gate(secret, b"relay lines", 4)
    listener, peer = _pair()
    got = _admit_in_thread(listener, gate)
    with pytest.raises(handshake.HandshakeFailed):
        handshake.introduce(peer, secret, b"data plane", gate.challenge, b"abcd")
    got["thread"].join(5)
    assert "proof of the run's secret is wrong" in str(got["refused"])


# --- the data plane -------------------------------------------------------------------------------------


@pytest.fixture
def planes() -> Iterator[tuple[DataPlane, DataPlane, DataPlane]]:
    secret = RunSecret.new()
    trio = tuple(DataPlane(r, secret, guard_s=5.0, world=3) for r in range(3))
    addresses = {r: p.address for r, p in enumerate(trio)}
    for p in trio:
        p.new_epoch(1, addresses)
    try:
        yield trio  # type: ignore[misc]
    finally:
        for p in trio:
            p.close()


def _exchange(a: DataPlane, b: DataPlane, tag: str = "t") -> bytes:
    a.send(b.rank, DATA, {"tag": tag}, b"data")
    a.flush()
    kind, _, payload = b.recv(a.rank, tag)
    assert kind == DATA
    return bytes(payload)


def _wait_for(pred: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_stranger_on_either_socket_runs_nothing_delivers_nothing_and_is_reported(
    planes: tuple[DataPlane, DataPlane, DataPlane], tmp_path: Path
) -> None:
    a, b, _ = planes
    host, port, unix_path, _, _ = b.address
    targets = [(host, port), unix_path]
    for i, target in enumerate(targets):
        for data in attacks(tmp_path / f"ran-{i}"):
            assert stranger(target, data) == b""  # closed, with not a byte said
    assert list(tmp_path.iterdir()) == []
    _wait_for(lambda: len(b.refused) == 6)
    assert len(b.refused) == 6 and b._inbox == {}  # nothing was taken as a link
    tcp = [r for r in b.refused if f"tcp {host}:{port}" in r["listener"]]
    unix = [r for r in b.refused if unix_path in r["listener"]]
    assert len(tcp) == len(unix) == 3
    assert all(r["peer"].startswith("127.0.0.1:") for r in tcp)
    assert all(r["peer"].startswith(f"pid {os.getpid()} ") for r in unix)  # the kernel names the process
    assert all("no proof of the run's secret" in r["reason"] for r in b.refused)
    assert _exchange(a, b) == b"data"  # the run's own peers still get through


def test_a_peer_of_another_run_is_refused(planes: tuple[DataPlane, DataPlane, DataPlane]) -> None:
    a, b, _ = planes
    other = DataPlane(0, RunSecret.new(), guard_s=3.0, world=3)
    try:
        other.new_epoch(1, {0: other.address, 1: b.address})
        other.send(1, DATA, {"tag": "t"}, b"forged gradient")
        other.flush()
        _wait_for(lambda: b.refused)
        assert "proof of the run's secret is wrong" in b.refused[0]["reason"]
        assert _exchange(a, b) == b"data"
    finally:
        other.close()


def test_unix_sockets_live_in_a_folder_only_this_user_can_enter_removed_on_close() -> None:
    plane = DataPlane(0, RunSecret.new())
    folder = os.path.dirname(plane.address[2])
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    plane.close()
    assert not os.path.exists(folder)


# --- malformed frames from a peer that did authenticate -------------------------------------------------


def _authenticated(plane: DataPlane, src: int, epoch: int = 1) -> socket.socket:
    """A raw connection to ``plane`` that proved the run's secret, claiming to be rank ``src``."""
    sock = socket.create_connection(plane.address[:2], timeout=5)
    challenge = bytes.fromhex(plane.address[4])
    handshake.introduce(sock, plane.secret, b"data plane", challenge, HELLO.pack(src, epoch))
    return sock


def _frame(kind: int, header: bytes, plen: int, payload: bytes = b"") -> bytes:
    return PREFIX.pack(kind, len(header), plen) + header + payload


MALFORMED = {
    "truncated": _frame(DATA, b'{"tag":"t"}', 1000, b"x" * 10),
    "length 2**62": _frame(DATA, b'{"tag":"t"}', 2**62),
    "header not JSON": _frame(DATA, b"\x80\x04not json", 0),
    "header a list": _frame(DATA, b"[1, 2]", 0),
    "header past the limit": PREFIX.pack(DATA, MAX_HEADER + 1, 0),
    "unknown kind": _frame(77, b'{"tag":"t"}', 0),
    "lane without a descriptor": _frame(LANE, b'{"tag":"","bytes":4096}', 0),
    "payload in a lane never passed": _frame(DATA, b'{"tag":"t","lane":[0,8,8]}', 0),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_frame_fails_its_link_only_and_quickly(
    planes: tuple[DataPlane, DataPlane, DataPlane], name: str
) -> None:
    _, b, c = planes
    sock = _authenticated(b, 0)
    sock.sendall(MALFORMED[name])
    sock.shutdown(socket.SHUT_WR)  # what a peer sends and then stops: nothing more will come
    t0 = time.monotonic()
    with pytest.raises((FrameError, PeerClosed)) as err:
        b.recv(0, "t")
    assert time.monotonic() - t0 < 2.0
    if name == "truncated":  # ends mid-frame: the peer's process is gone, as a SIGKILL mid-send
        assert isinstance(err.value, PeerClosed)
    else:
        assert isinstance(err.value, FrameError)
        text = str(err.value)
        assert "rank 1: the link from rank 0 is failed: it sent" in text
        assert b.refused and b.refused[-1]["peer"] == "rank 0"
        with pytest.raises(FrameError):  # the failed link stays failed for this epoch
            b.recv(0, "t")
    assert _exchange(c, b) == b"data"  # every other link of the rank works
    sock.close()


def test_a_truncated_frame_from_a_peer_that_stays_silent_ends_at_the_guard() -> None:
    secret = RunSecret.new()
    plane = DataPlane(1, secret, guard_s=0.5, world=2)
    try:
        plane.new_epoch(1, {1: plane.address})
        sock = _authenticated(plane, 0)
        sock.sendall(MALFORMED["truncated"])
        t0 = time.monotonic()
        with pytest.raises(TestbedError, match="testbed itself is stuck"):
            plane.recv(0, "t")
        assert time.monotonic() - t0 < 3.0
        sock.close()
    finally:
        plane.close()


def test_a_hello_of_an_older_epoch_or_of_a_rank_outside_the_world_is_dropped(
    planes: tuple[DataPlane, DataPlane, DataPlane],
) -> None:
    _, b, _ = planes
    with pytest.raises(handshake.HandshakeFailed):  # the plane is at epoch 1: an old link is not taken
        _authenticated(b, 0, epoch=0)
    with pytest.raises(handshake.HandshakeFailed):  # not a rank of this world: refused in the handshake
        _authenticated(b, 7)
    with pytest.raises(handshake.HandshakeFailed):  # nor the plane's own rank
        _authenticated(b, 1)
    _wait_for(lambda: len(b.refused) == 2)
    assert [r["reason"] for r in b.refused] == [
        "it claims to be rank 7, which is not a peer in a world of 3",
        "it claims to be rank 1, which is not a peer in a world of 3",
    ]
    assert b._inbox == {}  # none was registered; a stale epoch is routine, not reported


frames = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda kind, header, plen, payload: _frame(kind, header, plen, payload),
        st.integers(0, 255),
        st.one_of(
            st.binary(max_size=40),
            st.builds(lambda v: json.dumps(v).encode(), st.recursive(st.none() | st.integers(), st.lists)),
            st.just(b'{"tag":"t"}'),
        ),
        st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1)),
        st.binary(max_size=64),
    ),
)


@settings(max_examples=60, deadline=None)
@given(data=st.lists(frames, min_size=1, max_size=3))
def test_fuzzed_frames_never_hang_a_rank_crash_it_or_allocate_without_bound(data: list[bytes]) -> None:
    secret = RunSecret.new()
    plane = DataPlane(1, secret, guard_s=2.0, world=2)
    sock = None
    try:
        plane.new_epoch(1, {1: plane.address})
        sock = _authenticated(plane, 0)
        sock.sendall(b"".join(data))
        sock.shutdown(socket.SHUT_WR)
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            while True:  # read until the link ends one way or another
                _, header, payload = plane.recv(0, "t")
                assert header["tag"] == "t" and len(payload) <= MAX_PAYLOAD
        except (FrameError, PeerClosed):
            pass
        _, peak = tracemalloc.get_traced_memory()
        assert time.monotonic() - t0 < 2.0
        assert peak < 12 << 20  # a first chunk at most: never what a frame announced
    finally:
        tracemalloc.stop()
        if sock is not None:
            sock.close()
        plane.close()


# --- the relay lines between supernodes -----------------------------------------------------------------


class Lines:
    """Two supernodes' relay lines in this process, and what each was handed and refused."""

    def __init__(self, secret: RunSecret, world: int = 4) -> None:
        self.got: list[Any] = []
        self.refused: list[dict[str, Any]] = []
        self.a = RelayLines(0, "127.0.0.1", secret, world, self.got.extend, _no_fallback, self.refused.append)
        self.b = RelayLines(1, "127.0.0.1", secret, world, self.got.extend, _no_fallback, self.refused.append)
        self.a.set_addresses({1: self.b.address})

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _no_fallback(node: int, items: list[Any]) -> None:
    raise AssertionError("every line address is known")


def test_relay_lines_carry_markers_between_supernodes_that_share_the_secret() -> None:
    lines = Lines(RunSecret.new())
    try:
        lines.a.post(1, (0, 3, DATA, {"tag": "abort"}, [2, 3]))
        _wait_for(lambda: lines.got)
        assert lines.got == [(0, 3, DATA, {"tag": "abort"}, [2, 3])] and lines.refused == []
    finally:
        lines.close()


def test_a_stranger_on_a_relay_line_runs_nothing_and_is_reported(tmp_path: Path) -> None:
    lines = Lines(RunSecret.new())
    try:
        for data in attacks(tmp_path / "ran"):
            assert stranger(lines.b.address[:2], data) == b""
        _wait_for(lambda: len(lines.refused) == 3)
        assert list(tmp_path.iterdir()) == [] and lines.got == []
        assert len(lines.refused) == 3
        assert all("relay lines of supernode 1" in r["listener"] for r in lines.refused)
        lines.a.post(1, (1, 0, DATA, {"tag": "x"}, [3]))  # the run's own line still works
        _wait_for(lambda: lines.got)
        assert lines.got == [(1, 0, DATA, {"tag": "x"}, [3])]
    finally:
        lines.close()


@pytest.mark.parametrize(
    "body",
    [
        b"\x80\x04not json",
        b'{"a": 1}',
        b"[[0, 0, 0, {}, [1]]]",  # a header without a tag
        b'[[9, 0, 0, {"tag": "t"}, [1]]]',  # a rank outside the world of 4
        b'[[0, 0, 42, {"tag": "t"}, [1]]]',  # an unknown kind
        b'[[0, -1, 0, {"tag": "t"}, [1]]]',
        b'[[0, 0, 0, {"tag": "t"}, ["1"]]]',
    ],
)
def test_a_malformed_batch_from_a_supernode_of_the_run_drops_its_line_and_delivers_nothing(
    body: bytes,
) -> None:
    secret = RunSecret.new()
    lines = Lines(secret)
    try:
        sock = socket.create_connection(lines.b.address[:2], timeout=5)
        challenge = bytes.fromhex(lines.b.address[2])
        handshake.introduce(sock, secret, b"relay lines", challenge, struct.pack("!I", 0))
        sock.sendall(struct.pack("!I", len(body)) + body)
        assert sock.recv(1) == b""  # the line is dropped
        _wait_for(lambda: lines.refused)
        assert lines.got == [] and "it sent" in lines.refused[0]["reason"]
        sock.close()
    finally:
        lines.close()


def test_a_batch_announcing_more_than_the_limit_is_refused_before_it_is_read() -> None:
    secret = RunSecret.new()
    lines = Lines(secret)
    try:
        sock = socket.create_connection(lines.b.address[:2], timeout=5)
        challenge = bytes.fromhex(lines.b.address[2])
        handshake.introduce(sock, secret, b"relay lines", challenge, struct.pack("!I", 0))
        sock.sendall(struct.pack("!I", MAX_BATCH + 1))
        assert sock.recv(1) == b""
        _wait_for(lambda: lines.refused)
        assert f"the limit is {MAX_BATCH}" in lines.refused[0]["reason"]
        sock.close()
    finally:
        lines.close()


@given(st.binary(max_size=200))
def test_decoding_any_bytes_gives_markers_or_a_value_error(body: bytes) -> None:
    try:
        items = decode(body, 4)
    except ValueError:
        return
    assert decode(encode(items)[4:], 4) == items


def _listening_calls(tree: ast.AST) -> list[str]:
    """The calls in ``tree`` that open a listening socket or a multiprocessing Listener/Client."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("create_server", "listen", "Listener", "Client"):
                names.append(name)
        if isinstance(node, ast.ImportFrom) and node.module == "multiprocessing.connection":
            names += [a.name for a in node.names if a.name in ("Listener", "Client")]
    return names


def test_only_the_two_authenticated_listeners_listen_and_no_multiprocessing_listener_exists() -> None:
    """A listener anywhere else in the package, or a multiprocessing Listener/Client (pickle, and no
    authentication without an authkey), fails here: every listener must hold the run's handshake."""
    root = Path(__file__).resolve().parent.parent
    found: dict[str, list[str]] = {}
    for folder in ("testbed", "faults", "workloads"):
        for path in sorted((root / folder).rglob("*.py")):
            calls = _listening_calls(ast.parse(path.read_text(), str(path)))
            if calls:
                found[path.relative_to(root).as_posix()] = calls
    assert not any(c in ("Listener", "Client") for calls in found.values() for c in calls), found
    assert set(found) == {"testbed/fabric/listeners.py", "testbed/actors/relay_lines.py"}, found
    for module in found:
        assert "handshake.Gate(" in (root / module).read_text(), module
