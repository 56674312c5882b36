"""Shared-memory lanes: large payloads between processes on one host, copied once. The sender never
waits for room, the receiver checks every place and frees it only once the bytes have left it, and
nothing but a sealed memfd passed over the authenticated unix socket is ever mapped."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from testbed.core.errors import FrameError
from testbed.core.secret import RunSecret
from testbed.fabric import handshake, lane
from testbed.fabric.dataplane import DATA, DataPlane
from testbed.fabric.frames import FOLD_PIECE, Fold
from testbed.fabric.lane import LANE_BYTES, LANE_MIN, ReceiveLane, SendLane
from testbed.fabric.listeners import HELLO, PURPOSE

MiB = 1 << 20


def payload(k: int, n: int = MiB) -> bytes:
    return np.random.default_rng(k).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture
def pair() -> Iterator[tuple[DataPlane, DataPlane]]:
    secret = RunSecret.new()
    a, b = DataPlane(0, secret, guard_s=10.0, world=2), DataPlane(1, secret, guard_s=10.0, world=2)
    for plane in (a, b):
        plane.new_epoch(1, {0: a.address, 1: b.address})
    yield a, b
    a.close()
    b.close()


def test_a_sender_places_payloads_only_in_room_the_receiver_freed() -> None:
    a, b = socket.socketpair()
    sender = SendLane(4 * MiB)
    try:
        first = sender.place(a, payload(1))
        second = sender.place(a, payload(2, 2 * MiB))
        assert first == [0, MiB, MiB] and second == [MiB, 2 * MiB, 3 * MiB]
        assert sender.place(a, payload(3, 2 * MiB)) is None  # 1 MiB free: it goes over the socket
        b.sendall(lane.FREED.pack(MiB))  # the receiver freed the first payload
        # 1 MiB free at the end and 1 MiB at the start: a 2 MiB payload cannot wrap, it waits its turn
        assert sender.place(a, payload(3, 2 * MiB)) is None
        b.sendall(lane.FREED.pack(3 * MiB))  # all of it free: the next payload starts at the start
        assert sender.place(a, payload(4, 3 * MiB)) == [0, 3 * MiB, 7 * MiB]
        with memoryview(sender.mem) as mem:
            assert bytes(mem[: 3 * MiB]) == payload(4, 3 * MiB)
    finally:
        sender.close()
        a.close()
        b.close()


def test_a_receiver_maps_only_a_sealed_memfd() -> None:
    bare = os.memfd_create("unsealed")
    os.ftruncate(bare, 4096)
    with pytest.raises(ValueError, match="seals"):
        ReceiveLane(bare)  # it could shrink under the mapping
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(OSError):  # no file to seal at all
        ReceiveLane(r)
    sender = SendLane(4096)
    try:
        mapped = ReceiveLane(os.dup(sender.fd))
        assert mapped.size == 4096
        mapped.close()
    finally:
        sender.close()


def test_large_payloads_between_processes_on_one_host_take_the_lane_and_arrive_whole(
    pair: tuple[DataPlane, DataPlane],
) -> None:
    a, b = pair
    a.send(1, DATA, {"tag": "small"}, payload(0, LANE_MIN - 1))
    for k in range(3):
        a.send(1, DATA, {"tag": f"t{k}"}, payload(k))
    a.flush()
    _, _, small = b.recv(0, "small")
    assert bytes(small) == payload(0, LANE_MIN - 1)
    for k in range(3):
        into = memoryview(bytearray(MiB))
        _, header, got = b.recv(0, f"t{k}", into)
        assert got is into and bytes(into) == payload(k) and header["lane"][1] == MiB
    assert a._senders[1].lane_payloads == 3  # the small one went over the socket


def test_a_folded_payload_is_read_straight_from_the_lane_in_pieces(pair: tuple[DataPlane, DataPlane]) -> None:
    a, b = pair
    a.send(1, DATA, {"tag": "t"}, payload(5, 2 * FOLD_PIECE + 100))
    a.flush()
    seen: list[tuple[bytes, int]] = []
    into = memoryview(bytearray(b"\xee" * (2 * FOLD_PIECE + 100)))
    fold = Fold(lambda piece, at: seen.append((bytes(piece), at)), memoryview(bytearray(FOLD_PIECE)))
    b.recv(0, "t", into, fold=fold)
    assert fold.done and [at for _, at in seen] == [0, FOLD_PIECE, 2 * FOLD_PIECE]
    assert b"".join(p for p, _ in seen) == payload(5, 2 * FOLD_PIECE + 100)
    assert set(bytes(into)) == {0xEE}  # nothing was copied


def test_a_full_lane_sends_over_the_socket_in_order_and_a_kept_frame_survives_the_lane_s_reuse(
    pair: tuple[DataPlane, DataPlane],
) -> None:
    a, b = pair
    count = LANE_BYTES // MiB + 8  # more than the lane holds while the receiver reads nothing
    a.send(1, DATA, {"tag": "kept"}, payload(99))
    for k in range(count):  # queued: more than the socket's buffer holds, drained as b reads
        a.send(1, DATA, {"tag": "t"}, payload(k))
    for k in range(count):  # the first read keeps "kept" aside: copied out, its place freed
        _, _, got = b.recv(0, "t")
        assert bytes(got) == payload(k), k
    a.flush()
    sender = a._senders[1]
    assert 0 < sender.lane_payloads < count + 1  # some took the lane, the rest the socket
    for k in range(count, count + 70):  # the lane is reused from its start, many times over
        a.send(1, DATA, {"tag": "t"}, payload(k))
        a.flush()
        _, _, got = b.recv(0, "t")
        assert bytes(got) == payload(k), k
    assert sender.lane.head > LANE_BYTES  # type: ignore[union-attr]
    _, _, kept = b.recv(0, "kept")
    assert bytes(kept) == payload(99)


def _unix_peer(plane: DataPlane, src: int) -> socket.socket:
    """A raw unix-socket connection to ``plane`` that proved the run's secret as rank ``src``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(plane.address[2])
    handshake.introduce(sock, plane.secret, PURPOSE, bytes.fromhex(plane.address[4]), HELLO.pack(src, 1))
    return sock


@pytest.mark.parametrize("place", [[4000, 200, 4200], [-1, 8, 8], [0, 8], "0,8,8"])
def test_a_place_outside_the_lane_fails_the_link_as_a_malformed_frame(
    pair: tuple[DataPlane, DataPlane], place: object
) -> None:
    from testbed.fabric.frames import encode_head

    _, b = pair
    sock, sender = _unix_peer(b, 0), SendLane(4096)
    try:
        sender.announce(sock)
        sock.sendall(encode_head(DATA, {"tag": "t", "lane": place}, 0))
        with pytest.raises(FrameError, match="a payload placed outside its lane"):
            b.recv(0, "t")
        assert b.refused[-1]["reason"] == "it sent a payload placed outside its lane"
    finally:
        sender.close()
        sock.close()


def test_over_tcp_there_is_no_lane() -> None:
    secret = RunSecret.new()
    a, b = DataPlane(0, secret, "127.0.0.2", guard_s=10.0), DataPlane(1, secret, "127.0.0.3", guard_s=10.0)
    try:
        for plane in (a, b):
            plane.new_epoch(1, {0: a.address, 1: b.address})
        a.send(1, DATA, {"tag": "t"}, payload(7))
        a.flush()
        _, _, got = b.recv(0, "t")
        assert bytes(got) == payload(7) and a._senders[1].lane_payloads == 0
    finally:
        a.close()
        b.close()


def test_a_lane_closed_under_a_read_or_a_drain_ends_like_a_closed_link() -> None:
    a, b = socket.socketpair()
    sender = SendLane(4096)
    try:
        receiver = ReceiveLane(os.dup(sender.fd))
        receiver.close()
        with pytest.raises(ConnectionResetError):  # the data plane reads it as the peer's end
            receiver.take(b, [0, 8, 8], None, None)
    finally:
        sender.close()
        a.close()
        b.close()


def test_a_drain_whose_lane_was_closed_reports_the_link_failed_and_never_hangs_a_flush(
    pair: tuple[DataPlane, DataPlane],
) -> None:
    a, b = pair
    a.send(1, DATA, {"tag": "t"}, payload(1))
    a.flush()
    b.recv(0, "t")
    sender = a._senders[1]
    assert sender.lane is not None
    sender.lane.mem.close()  # as a close() that gave up waiting for the drain would leave it
    a.send(1, DATA, {"tag": "t"}, payload(2))
    a.flush()  # returns: the frame was handled, as failed
    assert sender.error is not None and "ValueError" in sender.error


def test_without_memfd_a_link_sends_over_its_socket(
    pair: tuple[DataPlane, DataPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memfd(*_: object) -> int:
        raise OSError("memfd_create is not available")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    a, b = pair
    a.send(1, DATA, {"tag": "t"}, payload(3))
    a.flush()
    _, _, got = b.recv(0, "t")
    assert bytes(got) == payload(3) and a._senders[1].lane is None and a._senders[1].error is None
