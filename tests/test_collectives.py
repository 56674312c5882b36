"""Collectives over real sockets (ranks as threads here): numpy-exact data, closed-form virtual time,
peer loss that unblocks every survivor, and wall-clock guards that never hang."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.clock import RankClock
from testbed.collectives import Communicator
from testbed.dataplane import DataPlane
from testbed.errors import HarnessHang, PeerLost
from testbed.topology import PRESETS, Topology


def run_ranks(topo: Topology, fn: Callable[[Communicator], Any], guard_s: float = 10.0) -> dict[int, Any]:
    """Run ``fn`` on every rank of ``topo`` at once (threads, real sockets); returns results or errors."""
    n = topo.world
    planes = [DataPlane(r, guard_s=guard_s) for r in range(n)]
    addrs = {r: p.address for r, p in enumerate(planes)}
    results: dict[int, Any] = {}

    def rank_main(r: int) -> None:
        try:
            planes[r].open_epoch(0, addrs, [(r + 1) % n] if n > 1 else [], [(r - 1) % n] if n > 1 else [])
            comm = Communicator(r, list(range(n)), planes[r], RankClock(), topo, exec_timeout_s=1836.0)
            results[r] = (fn(comm), comm)
        except Exception as exc:
            results[r] = (exc, None)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=guard_s * 3)
    for p in planes:
        p.close()
    assert len(results) == n, "a rank thread did not finish"
    return results


def one_supernode(n: int) -> Topology:
    return Topology(PRESETS["atlas-900-a3"], 1, n)


@given(n=st.integers(2, 5), count=st.integers(1, 300), dtype=st.sampled_from(["float32", "float64", "int64"]))
def test_allreduce_equals_numpy_sum(n: int, count: int, dtype: str) -> None:
    rng = np.random.default_rng(n * 1000 + count)
    inputs = [(rng.standard_normal(count) * 100).astype(dtype) for _ in range(n)]
    res = run_ranks(one_supernode(n), lambda c: c.allreduce(inputs[c.rank]))
    want = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    outs = [res[r][0] for r in range(n)]
    for out in outs:
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-5, atol=1e-3)
        assert out.tobytes() == outs[0].tobytes()  # the same bits on every rank


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_virtual_time_is_the_closed_form(n: int) -> None:
    topo = one_supernode(n)
    count = 1024 * n
    res = run_ranks(topo, lambda c: c.allreduce(np.ones(count, dtype=np.float32)))
    link = topo.preset.intra
    size = count * 4
    closed = 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * size / link.bandwidth_Bps
    for r in range(n):
        assert res[r][1].clock.t == pytest.approx(closed, rel=1e-12)


def test_broadcast_is_a_chain_with_its_closed_form() -> None:
    n, topo = 4, one_supernode(4)
    payload = np.arange(1000, dtype=np.float64)
    res = run_ranks(topo, lambda c: c.broadcast(payload if c.rank == 1 else np.zeros(1000), root=1))
    for r in range(n):
        np.testing.assert_array_equal(res[r][0], payload)
    link = topo.preset.intra
    last = 0  # the chain from root 1 runs 1 -> 2 -> 3 -> 0
    assert res[last][1].clock.t == pytest.approx(
        (n - 1) * (link.latency_s + payload.nbytes / link.bandwidth_Bps)
    )


def test_barrier_synchronises_clocks_to_the_latest_rank() -> None:
    topo = one_supernode(3)

    def late_rank_two(c: Communicator) -> float:
        if c.rank == 2:
            c.clock.advance_to(50.0)
        c.barrier()
        return c.clock.t

    res = run_ranks(topo, late_rank_two)
    assert all(res[r][0] >= 50.0 for r in range(3))


def test_a_dead_peer_raises_peer_lost_on_every_survivor() -> None:
    topo = one_supernode(4)

    def rank_one_dies(c: Communicator) -> Any:
        if c.rank == 1:
            c.dataplane.close()  # the process is gone: its sockets close
            return "dead"
        return c.allreduce(np.ones(64, dtype=np.float32))

    res = run_ranks(topo, rank_one_dies)
    for r in (0, 2, 3):
        err = res[r][0]
        assert isinstance(err, PeerLost), err
        assert err.peer == 1
    assert res[2][0].how == "eof"  # the successor saw the socket close
    assert {res[0][0].how, res[3][0].how} == {"abort"}  # the others got the forwarded abort


def test_a_silent_peer_trips_the_wall_guard_instead_of_hanging() -> None:
    topo = one_supernode(2)

    def rank_one_never_sends(c: Communicator) -> Any:
        if c.rank == 1:
            threading.Event().wait(1.5)
            return "silent"
        return c.allreduce(np.ones(4, dtype=np.float32))

    res = run_ranks(topo, rank_one_never_sends, guard_s=0.5)
    assert isinstance(res[0][0], HarnessHang)
    assert "rank 1" in str(res[0][0])
