"""Every collective and algorithm over real sockets (ranks as threads): numpy-exact results,
closed-form virtual times, several groups at once, dead peers and wall guards."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.collectives import (
    OFFERED,
    Communicator,
    Modelled,
    abort_job,
    choose,
    closed_form,
    doubling,
    hierarchical,
    mesh,
    ring,
)
from testbed.collectives import alltoall as a2a
from testbed.collectives import halving_doubling as hd
from testbed.collectives.ops import bf16_to_f32, f32_to_bf16, split
from testbed.collectives.select import RING_ACROSS_MAX, links_of
from testbed.core.errors import HarnessHang, PeerLost, TestbedError
from testbed.core.secret import RunSecret
from testbed.fabric.dataplane import DATA, DataPlane, PeerClosed
from tests.fabric import run_group, topology

NUMPY = {"sum": np.sum, "avg": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def valid_algorithms(collective: str, members: list[int], topo: Any) -> list[str]:
    n = len(members)
    algos = ["auto", *OFFERED[collective]]
    if n & (n - 1) and collective in ("reduce_scatter", "allgather"):
        algos.remove("halving_doubling")
    if "hierarchical" in algos:
        try:
            counts: dict[int, int] = {}
            for r in members:
                counts[topo.supernode_of(r)] = counts.get(topo.supernode_of(r), 0) + 1
            assert len(set(counts.values())) == 1
        except AssertionError:
            algos.remove("hierarchical")
    return algos


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    supernodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(1, 4))
    topo = topology(supernodes, per_node)
    members = sorted(draw(st.sets(st.integers(0, topo.world - 1), min_size=1, max_size=topo.world)))
    collective = draw(
        st.sampled_from(["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"])
    )
    dtype = draw(st.sampled_from(["float32", "float64", "int32", "int64", "bfloat16"]))
    ops = ["sum", "max", "min", "prod"] + (["avg"] if dtype in ("float32", "float64", "bfloat16") else [])
    return {
        "topo": topo,
        "members": members,
        "collective": collective,
        "algo": draw(st.sampled_from(valid_algorithms(collective, members, topo))),
        "dtype": dtype,
        "op": draw(st.sampled_from(ops)),
        "length": draw(st.sampled_from([0, 1, 3, 7, 64, 257])),
        "root": draw(st.sampled_from(members)),
        "seed": draw(st.integers(0, 2**16)),
    }


def inputs_for(case: dict[str, Any]) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(case["seed"])
    out = {}
    for r in case["members"]:
        if case["dtype"] == "bfloat16":
            out[r] = f32_to_bf16(rng.uniform(0.5, 2.0, case["length"]).astype(np.float32))
        elif case["dtype"].startswith("int"):
            out[r] = rng.integers(-5, 6, case["length"]).astype(case["dtype"])
        else:
            out[r] = rng.uniform(0.5, 2.0, case["length"]).astype(case["dtype"])
    return out


def reference(case: dict[str, Any], data: dict[int, np.ndarray]) -> np.ndarray:
    stack = np.stack([data[r] for r in case["members"]])
    if case["dtype"] == "bfloat16":
        stack = bf16_to_f32(stack).astype(np.float64)
    red = NUMPY[case["op"]](stack, axis=0)
    if case["op"] == "avg":
        red = red / len(case["members"])
    return red


def assert_matches(got: np.ndarray, want: np.ndarray, case: dict[str, Any]) -> None:
    if case["dtype"] == "bfloat16":
        np.testing.assert_allclose(bf16_to_f32(got), want, rtol=0.05 * len(case["members"]), atol=1e-2)
    elif case["dtype"].startswith("int") or case["op"] in ("max", "min"):
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5 if case["dtype"] == "float32" else 1e-12)


def run_case(case: dict[str, Any]) -> None:
    data = inputs_for(case)
    members, n, bf16 = case["members"], len(case["members"]), case["dtype"] == "bfloat16"
    col, algo, op, root = case["collective"], case["algo"], case["op"], case["root"]

    def program(c: Communicator) -> Any:
        mine = data[c.rank]
        if col == "allreduce":
            return c.allreduce(mine, op=op, algo=algo, bf16=bf16)
        if col == "reduce_scatter":
            return c.reduce_scatter(mine, op=op, algo=algo, bf16=bf16)
        if col == "allgather":
            return c.allgather(mine, algo=algo)
        if col == "broadcast":
            return c.broadcast(mine, root=root, algo=algo)
        if col == "reduce":
            return c.reduce(mine, root=root, op=op, algo=algo, bf16=bf16)
        return c.alltoall([mine + np.asarray(j, dtype=mine.dtype) for j in range(n)], algo=algo)

    res = run_group(case["topo"], members, program)
    outs = {r: res[r][0] for r in members}
    for r, out in outs.items():
        assert not isinstance(out, Exception), f"rank {r}: {out!r}"
    if col in ("allreduce", "reduce_scatter", "reduce"):
        want = reference(case, data)
        for k, r in enumerate(members):
            if col == "allreduce":
                assert_matches(outs[r], want, case)
                assert outs[r].tobytes() == outs[members[0]].tobytes()  # identical bits everywhere
            elif col == "reduce_scatter":
                assert_matches(outs[r], np.array_split(want, n)[k], case)
            elif r == root:
                assert_matches(outs[r], want, case)
            else:
                assert outs[r] is None
    elif col == "allgather":
        want = np.concatenate([data[r] for r in members])
        for r in members:
            np.testing.assert_array_equal(outs[r], want)
    elif col == "broadcast":
        for r in members:
            np.testing.assert_array_equal(outs[r], data[root])
    else:
        for k, r in enumerate(members):
            for j, src in enumerate(members):
                np.testing.assert_array_equal(outs[r][j], data[src] + np.asarray(k, dtype=data[src].dtype))


@settings(max_examples=60)
@given(case=cases())
def test_every_collective_matches_numpy(case: dict[str, Any]) -> None:
    run_case(case)


def one_node(n: int) -> Any:
    return topology(1, n)


def timed(topo: Any, fn: Any) -> float:
    res = run_group(topo, list(range(topo.world)), fn)
    for r, (out, _) in res.items():
        assert not isinstance(out, Exception), f"rank {r}: {out!r}"
    return max(ep.clock.t for _, ep in res.values())


CLOSED = [
    ("allreduce", "ring", ring.allreduce_time),
    ("allreduce", "mesh", mesh.allreduce_time),
    ("allreduce", "halving_doubling", hd.allreduce_time),
    ("allreduce", "recursive_doubling", doubling.allreduce_time),
    ("reduce_scatter", "ring", ring.reduce_scatter_time),
    ("reduce_scatter", "mesh", mesh.reduce_scatter_time),
    ("reduce_scatter", "halving_doubling", hd.reduce_scatter_time),
    ("allgather", "ring", ring.reduce_scatter_time),
    ("allgather", "mesh", mesh.reduce_scatter_time),
    ("allgather", "halving_doubling", hd.reduce_scatter_time),
    ("broadcast", "ring", ring.chain_time),
    ("broadcast", "mesh", mesh.broadcast_time),
    ("broadcast", "halving_doubling", hd.broadcast_time),
    ("reduce", "ring", ring.chain_time),
    ("reduce", "mesh", mesh.reduce_time),
    ("alltoall", "pairwise", a2a.pairwise_time),
    ("alltoall", "mesh", a2a.mesh_time),
]


def prewarmed(collective: str, algo: str, count: int, n: int) -> Any:
    """A program that sets the algorithm's links up, syncs the clocks, then times one collective."""

    def program(c: Communicator) -> float:
        buf = np.ones(count, dtype=np.float32)
        blocks = [np.ones(count // n, dtype=np.float32) for _ in range(n)]
        piece = np.ones(count // n, dtype=np.float32)
        calls = {
            "allreduce": lambda: c.allreduce(buf, algo=algo),
            "reduce_scatter": lambda: c.reduce_scatter(buf, algo=algo),
            "allgather": lambda: c.allgather(piece, algo=algo),
            "broadcast": lambda: c.broadcast(buf, root=0, algo=algo),
            "reduce": lambda: c.reduce(buf, root=0, algo=algo),
            "alltoall": lambda: c.alltoall(blocks, algo=algo),
        }
        calls[collective]()  # sets the links up
        c.ep.clock.advance_to(1000.0)  # every rank starts the timed call together, egress idle
        c.ep.clock.egress_free = 1000.0
        calls[collective]()
        return c.ep.clock.t - 1000.0

    return program


@pytest.mark.parametrize(("collective", "algo", "formula"), CLOSED, ids=[f"{c}-{a}" for c, a, _ in CLOSED])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_contention_free_time_is_the_closed_form(collective: str, algo: str, formula: Any, n: int) -> None:
    if algo == "halving_doubling" and collective in ("reduce_scatter", "allgather") and n & (n - 1):
        pytest.skip("power-of-two groups only")
    topo = one_node(n)
    count = 4096 * n
    res = run_group(topo, list(range(n)), prewarmed(collective, algo, count, n))
    durations = [out for out, _ in res.values()]
    assert all(not isinstance(d, Exception) for d in durations), durations
    link = topo.preset.intra
    want = formula(n, count * 4, link.latency_s, link.bandwidth_Bps)
    folded = (collective, algo) in (("broadcast", "halving_doubling"), ("allreduce", "recursive_doubling"))
    if folded and n & (n - 1):
        assert max(durations) <= want  # these forms are exact for powers of two only
    else:
        assert max(durations) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    ("supernodes", "local"), [(2, 2), (2, 4), (3, 2), (4, 4), (16, 2), (12, 2), (2, 16), (3, 16)]
)
def test_hierarchical_allreduce_time_is_its_closed_form(supernodes: int, local: int) -> None:
    topo = topology(supernodes, local)
    count = 8192 * local * supernodes
    res = run_group(topo, list(range(topo.world)), prewarmed("allreduce", "hierarchical", count, topo.world))
    durations = [out for out, _ in res.values()]
    p = topo.preset
    want = hierarchical.allreduce_time(
        supernodes,
        local,
        count * 4,
        (p.intra.latency_s, p.intra.bandwidth_Bps),
        (p.inter.latency_s, p.inter.bandwidth_Bps),
    )
    assert max(durations) == pytest.approx(want, rel=1e-9)
    ring_time = ring.allreduce_time  # hierarchical beats a flat ring that crosses the slow links
    assert want < ring_time(topo.world, count * 4, p.inter.latency_s, p.inter.bandwidth_Bps)


# (9 x 16 runs in the scale benchmark: more threads than this in-process harness keeps within its guard)
@pytest.mark.parametrize(("supernodes", "local"), [(8, 2), (9, 2), (12, 2), (16, 2), (2, 16), (3, 16)])
def test_across_many_supernodes_hierarchical_doubles_and_still_sums_right(
    supernodes: int, local: int
) -> None:
    topo = topology(supernodes, local)
    world = list(range(topo.world))

    def program(c: Communicator) -> np.ndarray:
        return c.allreduce(np.arange(10, dtype=np.float64) * (c.rank + 1), algo="hierarchical")

    res = run_group(topo, world, program)
    want = np.arange(10, dtype=np.float64) * sum(r + 1 for r in world)
    assert all(np.array_equal(out, want) for out, _ in res.values())
    links = set(links_of("hierarchical", world, topo))
    across = {(a, b) for a, b in links if topo.supernode_of(a) != topo.supernode_of(b)}
    if supernodes > RING_ACROSS_MAX:  # halving-doubling across: a rank talks to log2 peers, not 2
        assert max(sum(1 for a, _ in across if a == r) for r in world) >= 3
    else:  # a ring of the same-position peers
        assert all(sum(1 for a, _ in across if a == r) == 1 for r in world)
    inside = {(a, b) for a, b in links if (a, b) not in across}
    # more than 8 members a power of two: halving-doubling inside (log2 16 = 4 peers), else a ring
    assert max(sum(1 for a, _ in inside if a == r) for r in world) == (4 if local == 16 else 1)


def test_first_use_pays_link_setup_once_per_group_and_algorithm() -> None:
    topo = one_node(4)

    def program(c: Communicator) -> list[float]:
        times = []
        for algo in ("ring", "ring", "mesh"):
            t0 = c.ep.clock.t
            c.allreduce(np.ones(16, dtype=np.float32), algo=algo)
            times.append(c.ep.clock.t - t0)
        return times

    res = run_group(topo, [0, 1, 2, 3], program)
    first, second, third = (max(out[i] for out, _ in res.values()) for i in range(3))
    model = topo.preset.link_setup
    assert first > model.base_s and third > model.base_s  # each algorithm sets its own links up
    assert second < 1e-3  # the ring's links are already up


def test_auto_choice_follows_placement_and_size() -> None:
    two_nodes = topology(2, 4)
    assert choose("allreduce", list(range(8)), two_nodes, 1 << 20) == "hierarchical"
    assert choose("allreduce", [0, 1, 2, 3], two_nodes, 1 << 20) == "ring"
    assert choose("allreduce", [0, 1, 2, 3], two_nodes, 1024) == "recursive_doubling"
    assert choose("allreduce", [0, 1, 2, 3], two_nodes, 32 * 1024) == "halving_doubling"
    assert choose("allreduce", [4, 5], two_nodes, 2048) == "recursive_doubling"
    assert choose("allreduce", [4, 5], two_nodes, 1 << 20) == "ring"
    assert choose("allreduce", [0, 1, 2], two_nodes, 1024) == "mesh"
    assert choose("alltoall", list(range(8)), two_nodes, 1024) == "pairwise"


def test_a_large_group_that_is_no_power_of_two_folds_into_doubling_and_never_meshes() -> None:
    full = topology(1, 384)  # one CloudMatrix384 supernode
    world, board = list(range(384)), list(range(12))
    assert choose("allreduce", world, full, 8) == "recursive_doubling"  # 10 rounds, not a ring's 766
    # a barrier (once per checkpoint) keeps to a ring's n links: n log n would take minutes to set up
    assert choose("barrier", world, full, 8) == "ring"
    assert choose("allreduce", world, full, 32 * 1024) == "halving_doubling"
    assert choose("allreduce", world, full, 1 << 20) == "ring"  # bandwidth-bound: the ring
    assert choose("allreduce", list(range(24)), full, 32 * 1024) == "halving_doubling"
    assert choose("allreduce", board, full, 32 * 1024) == "mesh"  # a mesh only up to MESH_MAX ranks
    assert choose("allreduce", board, full, 1024) == "mesh"


def test_the_algorithm_that_ran_is_recorded() -> None:
    res = run_group(one_node(4), [0, 1, 2, 3], lambda c: c.allreduce(np.ones(8, dtype=np.float32)))
    for _, ep in res.values():
        assert ep.algorithms_run == ["allreduce:recursive_doubling"]


def test_several_groups_at_once_over_shared_links() -> None:
    topo = one_node(4)

    def program(c: Communicator) -> list[float]:
        pair = Communicator(c.ep, f"pair{c.rank // 2}", [c.rank // 2 * 2, c.rank // 2 * 2 + 1])
        out = []
        for k in range(3):
            out.append(float(c.allreduce(np.full(5, c.rank + k, dtype=np.float64), algo="ring")[0]))
            out.append(float(pair.allreduce(np.full(3, c.rank, dtype=np.float64), algo="mesh")[0]))
        return out

    res = run_group(topo, [0, 1, 2, 3], program)
    for r in range(4):
        got = res[r][0]
        assert got[0::2] == [6.0, 10.0, 14.0]
        assert got[1::2] == [1.0] * 3 if r < 2 else [5.0] * 3


def test_news_of_a_replaced_process_s_death_does_not_end_a_wait_on_its_successor() -> None:
    """A rank's death reaches its peers through the supernodes, and may land after the restart opened
    a new epoch with the rank's new process: that news must not end the wait on the new process."""
    secret = RunSecret.new()
    waiter, old, new = (DataPlane(r, secret, guard_s=10.0) for r in (0, 1, 1))
    try:
        waiter.new_epoch(0, {1: old.address})
        waiter.new_epoch(1, {1: new.address})
        new.new_epoch(1, {0: waiter.address})
        waiter.mark_dead(1, list(old.address))  # late: the old process's death

        def send_later() -> None:  # the wait begins before the new process's link is open
            time.sleep(0.2)
            new.send(0, DATA, {"tag": "t"}, b"")
            new.flush()

        sender = threading.Thread(target=send_later)
        sender.start()
        kind, header, _ = waiter.recv(1, "t")
        sender.join(10)
        assert (kind, header["tag"]) == (DATA, "t")
        waiter.new_epoch(2, {1: new.address})  # no link from it this epoch
        waiter.mark_dead(1, list(new.address))  # the current process's death ends the wait
        with pytest.raises(PeerClosed):
            waiter.recv(1, "never")
    finally:
        for plane in (waiter, old, new):
            plane.close()


@pytest.mark.parametrize("algo", ["ring", "mesh", "halving_doubling", "recursive_doubling"])
def test_a_dead_peer_raises_peer_lost_on_every_survivor(algo: str) -> None:
    res = run_group(
        one_node(4), [0, 1, 2, 3], lambda c: c.allreduce(np.ones(64, dtype=np.float32), algo=algo), dying={1}
    )
    for r in (0, 2, 3):
        err = res[r][0]
        assert isinstance(err, PeerLost), err
        assert err.peer == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("job_abort_follows", [False, True])
def test_inside_a_step_a_failing_collective_leaves_its_abort_to_the_job_abort(
    job_abort_follows: bool,
) -> None:
    sent: dict[int, list[str]] = {}

    def program(c: Communicator) -> Any:
        ep = c.ep
        send = ep.dataplane.send_markers
        ep.dataplane.send_markers = lambda peers, kind, header: (  # type: ignore[method-assign]
            sent.setdefault(c.rank, []).append(str(header["tag"])),
            send(peers, kind, header),
        )[1]
        ep.job_abort_follows = job_abort_follows
        try:
            return c.allreduce(np.ones(64, dtype=np.float32), algo="ring")
        except TestbedError as err:
            raise abort_job(ep, c.ranks, err) from None

    res = run_group(one_node(6), list(range(6)), program, dying={1})
    for r in (0, 2, 3, 4, 5):  # every survivor fails, none waits for a marker that never comes
        err = res[r][0]
        assert isinstance(err, PeerLost) and err.how in ("eof", "abort"), err  # type: ignore[attr-defined]
        tags = sent[r]
        # the job abort ("*...") always; the collective's own only when no job abort follows
        assert [t.startswith("*") for t in tags] == ([True] if job_abort_follows else [False, True])


def test_a_silent_peer_trips_the_wall_guard_instead_of_hanging() -> None:
    def program(c: Communicator) -> Any:
        if c.rank == 1:
            threading.Event().wait(1.5)
            return "silent"
        return c.allreduce(np.ones(4, dtype=np.float32), algo="ring")

    res = run_group(one_node(2), [0, 1], program, guard_s=0.5)
    assert isinstance(res[0][0], HarnessHang)
    assert "rank 1" in str(res[0][0])


def test_split_cuts_as_numpy_array_split_does() -> None:
    for length in range(0, 40):
        flat = np.arange(length)
        for n in range(1, 10):
            got, want = split(flat, n), np.array_split(flat, n)
            assert [c.tolist() for c in got] == [c.tolist() for c in want]
            assert all(c.base is flat or c.size == 0 or np.shares_memory(c, flat) for c in got)  # views


def test_bad_calls_are_clear_errors() -> None:
    def program(c: Communicator) -> list[str]:
        found = []
        for call in (
            lambda: c.allreduce(np.ones(3, dtype=np.int32), op="avg"),
            lambda: c.allreduce(np.ones(3, dtype=np.float32), op="median"),
            lambda: c.allreduce(np.ones(3, dtype=np.float32), algo="pairwise"),
            lambda: c.allreduce(np.ones(3, dtype=np.float16)),
            lambda: c.broadcast(np.ones(3), root=9),
            lambda: c.allreduce(np.ones(4), out=np.ones(8)[::2]),
            lambda: c.allreduce(np.ones(4), out=np.ones(3)),
        ):
            try:
                call()
            except TestbedError as exc:
                found.append(str(exc))
        return found

    res = run_group(one_node(1), [0], program)
    messages = res[0][0]
    assert len(messages) == 7
    assert "truncate" in messages[0] and "median" in messages[1] and "pairwise" in messages[2]
    assert "float16" in messages[3] and "root 9" in messages[4]
    assert all("out must be a writeable, contiguous array" in m for m in messages[5:])


def test_point_to_point_messages_arrive_in_order_per_pair() -> None:
    def program(c: Communicator) -> list[float]:
        peer = 1 - c.rank
        for k in range(3):
            c.send_to(peer, np.full(4, 10 * c.rank + k, dtype=np.int64))
        return [float(c.recv_from(peer)[0]) for _ in range(3)]

    res = run_group(one_node(2), [0, 1], program)
    assert res[0][0] == [10.0, 11.0, 12.0]
    assert res[1][0] == [0.0, 1.0, 2.0]


def test_receiving_into_a_buffer_of_the_wrong_size_is_a_clear_error() -> None:
    def program(c: Communicator) -> Any:
        c.begin("probe", "p2p", 1)
        if c.rank == 0:
            c.send(1, np.ones(4, dtype=np.float32))
            return "sent"
        try:
            c.recv_into(0, np.empty(3, dtype=np.float32))
        except TestbedError as exc:
            return str(exc)
        return "no error"

    res = run_group(one_node(2), [0, 1], program)
    assert "expected 12 bytes" in res[1][0] and "got 16 bytes" in res[1][0]


@settings(max_examples=40)
@given(
    entry=st.sampled_from(CLOSED),
    n=st.integers(2, 12),
    per_rank=st.integers(0, 1000),
)
def test_closed_forms_hold_for_any_group_size_and_length(entry: Any, n: int, per_rank: int) -> None:
    collective, algo, formula = entry
    power_of_two_only = (algo, collective) in (
        ("halving_doubling", "reduce_scatter"),
        ("halving_doubling", "allgather"),
        ("halving_doubling", "broadcast"),
        ("recursive_doubling", "allreduce"),  # otherwise an upper bound, tested above
    )
    if power_of_two_only and n & (n - 1):
        n = 1 << (n.bit_length() - 1)
    core = 1 << (n.bit_length() - 1) if algo == "halving_doubling" else 1
    count = per_rank * n * core  # chunks of equal length, as the closed forms assume
    topo = one_node(n)
    res = run_group(topo, list(range(n)), prewarmed(collective, algo, count, n))
    durations = [out for out, _ in res.values()]
    assert all(not isinstance(d, Exception) for d in durations), durations
    link = topo.preset.intra
    want = formula(n, count * 4, link.latency_s, link.bandwidth_Bps)
    # the timed call starts at t = 1000 s, where the float spacing is 1.1e-13: each of the algorithm's
    # rounds (at most 2(n-1)) rounds the clock a few times, so the absolute error grows with n
    assert max(durations) == pytest.approx(want, rel=1e-9, abs=n * 4e-13)


def timed_again(call: Any) -> Any:
    """A program that runs ``call(c)`` once (setting its links up), starts every rank together at
    t = 1000 s with its egress idle, runs it again and returns (its seconds, its algorithm, its result)."""

    def program(c: Communicator) -> Any:
        call(c)
        c.ep.clock.advance_to(1000.0)
        c.ep.clock.egress_free = 1000.0
        out = call(c)
        return c.ep.clock.t - 1000.0, c.algo, out

    return program


@pytest.mark.parametrize(
    ("supernodes", "local", "collective"),
    [(1, 4, "allreduce"), (2, 4, "allreduce"), (3, 2, "allreduce"), (1, 4, "alltoall"), (2, 2, "allgather")],
)
def test_a_collective_timed_at_a_modelled_size_takes_its_closed_form_at_that_size(
    supernodes: int, local: int, collective: str
) -> None:
    """A collective that stands for a modelled job's moves the proxy's real data, but picks and times
    the algorithm at the job's size: :func:`closed_form.collective_s` says beforehand what it takes,
    and ``calls`` of them take as long as that many."""
    topo = topology(supernodes, local)
    n, count = topo.world, 64 * topo.world
    size = 3.0e9  # 3 GB: bandwidth-bound, where auto picks what a real gradient sync would
    _, latency, transfer = closed_form.split_s(collective, list(range(n)), topo, size)
    modelled = Modelled(latency, transfer, int(size))

    def call(c: Communicator) -> Any:
        buf = np.arange(count, dtype=np.float32) + c.rank
        calls = {
            "allreduce": lambda: c.allreduce(buf, modelled=modelled),
            "alltoall": lambda: c.alltoall(list(np.split(buf, n)), modelled=modelled),
            "allgather": lambda: c.allgather(buf[: count // n], modelled=modelled),
        }
        return calls[collective]()

    res = run_group(topo, list(range(n)), timed_again(call))
    outs = [v for v, _ in res.values()]
    assert all(not isinstance(o, Exception) for o in outs), outs
    algo, want = closed_form.collective_s(collective, list(range(n)), topo, size)
    assert {o[1] for o in outs} == {algo}
    took = max(o[0] for o in outs)
    if supernodes > 1 and algo != "hierarchical":  # the slow hops pace each round; some hops' latency is less
        assert want * (1 - 1e-3) <= took <= want * (1 + 1e-9)
    else:
        assert took == pytest.approx(want, rel=1e-9)
    if collective == "allreduce":  # the data is the proxy's, summed for real
        expected = sum(np.arange(count, dtype=np.float32) + r for r in range(n))
        assert all(np.array_equal(o[2], expected) for o in outs)
    plain = run_group(topo, list(range(n)), lambda c: c.allreduce(np.ones(count, np.float32)) is not None)
    assert all(v is True for v, _ in plain.values())


def test_a_collective_standing_for_many_calls_pays_their_latency_and_picks_by_one_calls_size() -> None:
    topo = one_node(4)
    ranks = list(range(4))
    # 64 of a job's 8 KiB allreduces: each alone is tiny (recursive doubling, latency-bound)
    _, latency, transfer = closed_form.split_s("allreduce", ranks, topo, 8192.0)
    many = Modelled(64 * latency, 64 * transfer, 8192)

    res = run_group(topo, ranks, timed_again(lambda c: c.allreduce(np.ones(2048, np.float32), modelled=many)))
    took, algo, _ = max((v for v, _ in res.values()), key=lambda v: v[0])
    one_algo, one = closed_form.collective_s("allreduce", ranks, topo, 8192.0)
    assert algo == one_algo == "recursive_doubling"
    assert took == pytest.approx(64 * one, rel=1e-9)


def test_a_collective_in_a_smaller_group_takes_the_time_of_the_jobs_larger_one() -> None:
    """A proxy group of 4 stands for a job's group of 32 across 4 supernodes (modelled scale): its
    ring takes the job's hierarchical allreduce's time, latency and bandwidth parts alike."""
    job_topo, topo = topology(4, 8), one_node(4)
    size = 1.0e9
    algo, latency, transfer = closed_form.split_s("allreduce", list(range(32)), job_topo, size)
    assert algo == "hierarchical"
    modelled = Modelled(latency, transfer, int(size))

    res = run_group(
        topo, list(range(4)), timed_again(lambda c: c.allreduce(np.ones(4096, np.float32), modelled=modelled))
    )
    assert max(v[0] for v, _ in res.values()) == pytest.approx(latency + transfer, rel=1e-9)
