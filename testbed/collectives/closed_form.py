"""How long a collective takes on an idle fabric, by the closed form of the algorithm that runs it.

The algorithms' own modules give each closed form (the tests assert that a
contention-free run takes exactly that long); this picks
the one ``auto`` would run for a group and a size (:func:`choose`) and the
link class it crosses, so an estimate made with nothing started times a
collective as the run will.
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.collectives import alltoall, doubling, halving_doubling, hierarchical, mesh, ring
from testbed.collectives.select import choose
from testbed.topology.presets import Topology

Form = Callable[[int, float, float, float], float]

_FORMS: dict[tuple[str, str], Form] = {
    ("allreduce", "ring"): ring.allreduce_time,
    ("allreduce", "mesh"): mesh.allreduce_time,
    ("allreduce", "halving_doubling"): halving_doubling.allreduce_time,
    ("allreduce", "recursive_doubling"): doubling.allreduce_time,
    ("reduce_scatter", "ring"): ring.reduce_scatter_time,
    ("reduce_scatter", "mesh"): mesh.reduce_scatter_time,
    ("reduce_scatter", "halving_doubling"): halving_doubling.reduce_scatter_time,
    ("allgather", "ring"): ring.reduce_scatter_time,
    ("allgather", "mesh"): mesh.reduce_scatter_time,
    ("allgather", "halving_doubling"): halving_doubling.reduce_scatter_time,
    ("alltoall", "pairwise"): alltoall.pairwise_time,
    ("alltoall", "mesh"): alltoall.mesh_time,
}


def split_s(
    collective: str, ranks: list[int], topo: Topology, nbytes: float, algo: str = "auto"
) -> tuple[str, float, float]:
    """(the algorithm that runs, its latency part, its bandwidth part) in seconds for
    ``collective`` of ``nbytes`` over ``ranks``: ``algo``, or the one ``auto`` picks at ``nbytes``.

    The closed forms are sums of link latencies and of bytes over bandwidths, so each part is the
    form with the other zeroed. ``nbytes`` is the whole buffer (an allgather's gathered result;
    an all-to-all's blocks summed). A group spanning supernodes is timed on the slower class:
    its bandwidth paces every round, and its latency is an upper bound (hops inside a supernode
    are quicker); a hierarchical allreduce by its two-level form, exactly.
    """
    n = len(ranks)
    if n <= 1:
        return "none", 0.0, 0.0
    if algo == "auto":
        algo = choose(collective, ranks, topo, int(nbytes))
    p = topo.preset
    nodes = {topo.supernode_of(r) for r in ranks}
    inf = float("inf")
    if algo == "hierarchical":
        local = n // len(nodes)
        a_i, b_i, a_e, b_e = (
            p.intra.latency_s,
            p.intra.bandwidth_Bps,
            p.inter.latency_s,
            p.inter.bandwidth_Bps,
        )
        latency = hierarchical.allreduce_time(len(nodes), local, nbytes, (a_i, inf), (a_e, inf))
        return algo, latency, hierarchical.allreduce_time(len(nodes), local, nbytes, (0.0, b_i), (0.0, b_e))
    link = p.inter if len(nodes) > 1 else p.intra
    form = _FORMS[(collective, algo)]
    return algo, form(n, nbytes, link.latency_s, inf), form(n, nbytes, 0.0, link.bandwidth_Bps)


def collective_s(
    collective: str, ranks: list[int], topo: Topology, nbytes: float, algo: str = "auto"
) -> tuple[str, float]:
    """(the algorithm that runs, its seconds) for ``collective`` of ``nbytes`` over ``ranks``
    (:func:`split_s`, both parts)."""
    algo, latency, transfer = split_s(collective, ranks, topo, nbytes, algo)
    return algo, latency + transfer


def send_split_s(src: int, dst: int, topo: Topology, nbytes: float) -> tuple[float, float]:
    """One message of ``nbytes`` from ``src`` to ``dst``: (its link's latency, ``nbytes / bandwidth``)."""
    link = topo.link(src, dst)
    return link.latency_s, nbytes / link.bandwidth_Bps


def send_s(src: int, dst: int, topo: Topology, nbytes: float) -> float:
    """One message of ``nbytes`` from ``src`` to ``dst``: ``latency + nbytes / bandwidth``."""
    return sum(send_split_s(src, dst, topo, nbytes))
