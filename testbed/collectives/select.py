"""Which algorithm runs a collective when the caller says ``auto``, and how many links it sets up."""

from __future__ import annotations

import math

from testbed.topology.presets import Topology

#: Across up to this many supernodes a hierarchical allreduce's chunks go round a ring; across more,
#: halving-doubling (:mod:`testbed.collectives.hierarchical`).
RING_ACROSS_MAX = 8

#: Algorithms each collective offers (the first is the fallback).
OFFERED: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "mesh", "halving_doubling", "hierarchical", "recursive_doubling"),
    "reduce_scatter": ("ring", "mesh", "halving_doubling"),
    "allgather": ("ring", "mesh", "halving_doubling"),
    "broadcast": ("ring", "mesh", "halving_doubling"),
    "reduce": ("ring", "mesh"),
    "alltoall": ("pairwise", "mesh"),
    "barrier": ("ring", "mesh", "halving_doubling", "hierarchical", "recursive_doubling"),
}

#: Below this many bytes a collective is latency-bound: fewer hops win.
SMALL_BYTES = 64 * 1024
#: Below this many bytes sending the whole buffer every round costs less than the extra rounds.
TINY_BYTES = 8 * 1024
#: The largest group a full mesh serves: it sets up ``n(n-1)`` links, which HCCL does inside a
#: server (8 NPUs) or a small supernode, never across a 384-NPU one.
MESH_MAX = 16


def _uniform_across_supernodes(ranks: list[int], topo: Topology) -> bool:
    counts: dict[int, int] = {}
    for r in ranks:
        counts[topo.supernode_of(r)] = counts.get(topo.supernode_of(r), 0) + 1
    return len(counts) > 1 and len(set(counts.values())) == 1 and min(counts.values()) > 1


def choose(collective: str, ranks: list[int], topo: Topology, nbytes: int) -> str:
    """The algorithm ``auto`` picks, from the group's placement and the message size.

    Tiny messages (at most :data:`TINY_BYTES`) to a power-of-two group, or
    to any group larger than :data:`MESH_MAX`: ``recursive_doubling``
    (fewest rounds). Across supernodes with the same members in each:
    ``hierarchical`` (only a slice crosses the slow links). Small messages:
    ``halving_doubling`` for power-of-two groups (or any larger than
    :data:`MESH_MAX`), else ``mesh`` inside a supernode (groups of at most
    :data:`MESH_MAX`). All-to-all: ``pairwise``. Otherwise ``ring``
    (bandwidth-optimal).
    """
    n = len(ranks)
    offered = OFFERED[collective]
    if collective == "alltoall":
        return "pairwise"
    # past a mesh's size, the doubling algorithms fold a group that is no power of two (two rounds
    # more) rather than leave it to a ring's 2(n-1) rounds of latency; not for a barrier, which
    # runs once per checkpoint: n log n links to set up (at 384 ranks, minutes) would cost more
    doubling_fits = n & (n - 1) == 0 or (n > MESH_MAX and collective != "barrier")
    if "recursive_doubling" in offered and n > 1 and doubling_fits and nbytes <= TINY_BYTES:
        return "recursive_doubling"
    if n <= 2:
        return offered[0]
    if "hierarchical" in offered and _uniform_across_supernodes(ranks, topo):
        return "hierarchical"
    one_node = len({topo.supernode_of(r) for r in ranks}) == 1
    if nbytes <= SMALL_BYTES:
        if "halving_doubling" in offered and doubling_fits:
            return "halving_doubling"
        if one_node and n <= MESH_MAX and "mesh" in offered:
            return "mesh"
    return "ring"


def links_at_once(algo: str, n: int) -> int:
    """Directed links the algorithm sets up in a group of ``n`` (the load term of the setup model)."""
    if n <= 1:
        return 1
    if algo in ("mesh", "pairwise"):
        return n * (n - 1)
    if algo in ("halving_doubling", "recursive_doubling"):
        return n * max(1, math.ceil(math.log2(n)))
    return n


def links_of(algo: str, members: list[int], topo: Topology) -> list[tuple[int, int]]:
    """The directed links an allreduce by ``algo`` over ``members`` sends on, sorted."""
    n = len(members)
    if n <= 1:
        return []
    if algo in ("mesh", "pairwise"):
        return sorted((a, b) for a in members for b in members if a != b)
    if algo in ("halving_doubling", "recursive_doubling"):
        p = 1 << (n.bit_length() - 1)
        r = n - p
        links = {(members[i], members[i + 1]) for i in range(0, 2 * r, 2)}
        links |= {(b, a) for a, b in links}
        core = [members[2 * v + 1] if v < r else members[v + r] for v in range(p)]
        d = 1
        while d < p:
            links |= {(core[v], core[v ^ d]) for v in range(p)}
            d *= 2
        return sorted(links)
    if algo == "hierarchical":
        by_node: dict[int, list[int]] = {}
        for m in members:
            by_node.setdefault(topo.supernode_of(m), []).append(m)
        rings = list(by_node.values())
        across = [[node[i] for node in by_node.values()] for i in range(len(rings[0]))]
        doubled: set[tuple[int, int]] = set()
        local = len(rings[0])
        if local > RING_ACROSS_MAX and local & (local - 1) == 0:  # halving-doubling inside too
            doubled = {link for node in rings for link in links_of("halving_doubling", node, topo)}
            rings = []
        if len(by_node) > RING_ACROSS_MAX:  # halving-doubling across (hierarchical.py)
            doubled |= {link for peers in across for link in links_of("halving_doubling", peers, topo)}
        else:
            rings += across
        return sorted(
            doubled
            | {
                (ring[i], ring[(i + 1) % len(ring)])
                for ring in rings
                if len(ring) > 1
                for i in range(len(ring))
            }
        )
    return sorted((members[i], members[(i + 1) % n]) for i in range(n))
