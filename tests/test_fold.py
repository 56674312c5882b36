"""Folding a payload as it arrives: the ring's reduce-scatter combines each piece of a peer's chunk
while it is in cache, and falls back to the whole payload wherever a piece may not be used yet (a
frame kept aside, a payload hook, a netem'd link whose copies may be turned away)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import numpy as np
import pytest

from testbed.collectives import Communicator
from testbed.collectives.endpoint import Received
from testbed.core.secret import RunSecret
from testbed.fabric import frames, lane
from testbed.fabric.dataplane import DATA, DataPlane
from testbed.fabric.frames import FOLD_PIECE, Fold
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.fabric.netem import Netem
from tests.fabric import run_group, topology

#: elements of float64 per rank: each ring chunk (a third) spans two whole pieces and part of a third
LENGTH = 3 * (FOLD_PIECE // 8 * 2 + 37)


def collecting(into: list[tuple[bytes, int]], buffer_bytes: int = FOLD_PIECE) -> Fold:
    return Fold(
        lambda piece, offset: into.append((bytes(piece), offset)), memoryview(bytearray(buffer_bytes))
    )


def test_a_payload_goes_through_the_fold_in_order_and_leaves_into_untouched() -> None:
    payload = np.random.default_rng(1).integers(0, 256, FOLD_PIECE * 2 + 100, dtype=np.uint8).tobytes()
    a, b = socket.socketpair()
    try:
        threading.Thread(target=a.sendall, args=(payload,), daemon=True).start()
        into = memoryview(bytearray(b"\xee" * len(payload)))
        seen: list[tuple[bytes, int]] = []
        fold = collecting(seen)
        assert frames.read_payload(b, len(payload), into, fold) is into
    finally:
        a.close()
        b.close()
    assert fold.done
    assert [offset for _, offset in seen] == [0, FOLD_PIECE, 2 * FOLD_PIECE]
    assert b"".join(piece for piece, _ in seen) == payload
    assert bytes(into) == b"\xee" * len(payload)  # the room for a whole payload was never written


def test_a_frame_kept_aside_is_not_folded_but_lands_whole() -> None:
    secret = RunSecret.new()
    sender, receiver = DataPlane(0, secret, guard_s=10.0), DataPlane(1, secret, guard_s=10.0)
    try:
        addresses = {0: sender.address, 1: receiver.address}
        sender.new_epoch(0, addresses)
        receiver.new_epoch(0, addresses)
        early, late = b"early" * 1000, b"late!" * 1000
        sender.send(1, DATA, {"tag": "b"}, early)
        sender.send(1, DATA, {"tag": "a"}, late)
        sender.flush()
        got: list[tuple[bytes, int]] = []
        fold_a = collecting(got)
        receiver.recv(0, "a", memoryview(bytearray(len(late))), fold=fold_a)  # reads "b" first, keeps it
        assert fold_a.done and b"".join(p for p, _ in got) == late
        into = memoryview(bytearray(len(early)))
        fold_b = collecting([])
        _, _, payload = receiver.recv(0, "b", into, fold=fold_b)
        assert not fold_b.done and payload is into and bytes(into) == early
    finally:
        sender.close()
        receiver.close()


def ring_allreduce(c: Communicator) -> Any:
    mine = np.arange(LENGTH, dtype=np.float64) * (c.rank + 1) + c.rank  # sums are exact in float64
    return c.allreduce(mine, algo="ring")


def want(members: list[int]) -> np.ndarray:
    return sum(np.arange(LENGTH, dtype=np.float64) * (r + 1) + r for r in members)  # type: ignore[return-value]


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each payload folded as it arrived, from the socket or from the link's shared-memory lane: its
    number of pieces."""
    counted: list[int] = []
    from_socket, from_lane = frames.fold_payload, lane.fold_view

    def socket_spy(sock: socket.socket, n: int, fold: Fold) -> bool:
        counted.append(-(-n // len(fold.buffer)))
        return from_socket(sock, n, fold)

    def lane_spy(view: memoryview, fold: Fold) -> None:
        counted.append(-(-len(view) // len(fold.buffer)))
        from_lane(view, fold)

    monkeypatch.setattr(frames, "fold_payload", socket_spy)
    monkeypatch.setattr(lane, "fold_view", lane_spy)
    return counted


def test_the_ring_folds_each_chunk_piece_by_piece_and_sums_exactly(folds: list[int]) -> None:
    res = run_group(topology(1, 3), [0, 1, 2], ring_allreduce)
    for r in range(3):
        np.testing.assert_array_equal(res[r][0], want([0, 1, 2]))
    assert folds == [3] * 6  # each rank folds n - 1 = 2 chunks of three pieces


def test_with_a_payload_hook_the_ring_reduces_whole_chunks_the_hook_has_seen(folds: list[int]) -> None:
    seen: list[int] = []

    def program(c: Communicator) -> Any:
        def hook(msg: Received, arr: np.ndarray) -> np.ndarray:
            seen.append(arr.size)
            return arr + 1.0 if msg.half == "reduce_scatter" and c.rank == 0 else arr

        c.ep.on_payload = hook
        return ring_allreduce(c)

    res = run_group(topology(1, 3), [0, 1, 2], program)
    assert folds == [] and len(seen) == 12  # 3 ranks, 2 receives in each half
    # rank 0's two reduce-scatter receives each added 1 to a chunk it passed on or kept
    assert not np.array_equal(res[1][0], want([0, 1, 2]))
    assert np.array_equal(res[0][0], res[1][0]) and np.array_equal(res[1][0], res[2][0])


def test_a_netem_link_s_copies_are_read_whole_so_a_corrupted_one_never_reaches_the_sum(
    folds: list[int],
) -> None:
    netem = Netem(corrupt=0.5, duplicate=0.3)
    faults = LinkFaultTable(
        (LinkFault("f", "netem", 1, 2, netem=netem), LinkFault("f", "netem", 2, 1, netem=netem))
    )
    res = run_group(topology(1, 3), [0, 1, 2], ring_allreduce, faults=faults)
    for r in range(3):
        np.testing.assert_array_equal(res[r][0], want([0, 1, 2]))
    hits: dict[str, int] = {}
    for _, ep in res.values():
        for k, v in ep.fault_hits.items():
            hits[k] = hits.get(k, 0) + v
    assert hits.get("f.corrupted", 0) > 0 and hits["f.caught"] == hits["f.corrupted"]
    assert len(folds) == 6 - 2  # rank 2's two receives come over the netem'd link 1->2: whole
