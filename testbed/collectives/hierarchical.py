"""Hierarchical two-level allreduce, for groups that span supernodes.

With ``P`` supernodes holding ``L`` members each (the same positions in
each), ``S`` the full buffer, ``(a_i, B_i)`` the intra-supernode link and
``(a_e, B_e)`` the inter-supernode link (the scheme of Jia et al., "Highly
Scalable Deep Learning Training System with Mixed-Precision", 2018, and of
HCCL's hierarchical allreduce):

1. reduce-scatter inside each supernode (ring): ``(L-1)·a_i + (L-1)/L · S/B_i``;
   with more than :data:`RING_ACROSS_MAX` members a power of two, recursive
   halving: ``log2(L)·a_i + (L-1)/L · S/B_i`` (and recursive doubling in 3)
2. allreduce of each ``S/L`` chunk across supernodes among same-position
   peers (ring): ``2(P-1)·a_e + 2(P-1)/P · S/(L·B_e)``; across more than
   :data:`RING_ACROSS_MAX` supernodes, halving-doubling instead
   (:mod:`testbed.collectives.halving_doubling`): ``2 log2(P)`` rounds, not
   ``2(P-1)``, which at 24 supernodes is 10 rounds of latency instead of 46
3. allgather inside each supernode (ring): ``(L-1)·a_i + (L-1)/L · S/B_i``

Only ``1/L`` of the data crosses the slow links.
"""

from __future__ import annotations

import numpy as np

from testbed.collectives import halving_doubling, ring
from testbed.collectives.group import Group
from testbed.collectives.ops import split
from testbed.collectives.select import RING_ACROSS_MAX
from testbed.core.errors import TestbedError


def layout(g: Group) -> tuple[list[int], list[int]]:
    """(members of this rank's supernode, its same-position peers across supernodes)."""
    topo = g.ep.topology
    by_node: dict[int, list[int]] = {}
    for r in g.ranks:
        by_node.setdefault(topo.supernode_of(r), []).append(r)
    sizes = {len(v) for v in by_node.values()}
    if len(sizes) != 1:
        raise TestbedError(
            f"hierarchical allreduce needs the same number of group members in every supernode; group "
            f"'{g.name}' has {sorted(len(v) for v in by_node.values())}; use ring",
            group=g.name,
        )
    local = by_node[topo.supernode_of(g.rank)]
    pos = local.index(g.rank)
    peers = [members[pos] for _, members in sorted(by_node.items())]
    return local, peers


def _doubles_inside(local: int) -> bool:
    """Whether the steps inside a supernode halve and double (more than 8 members, a power of two)."""
    return local > RING_ACROSS_MAX and local & (local - 1) == 0


def allreduce(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Reduce-scatter inside, allreduce across, allgather inside."""
    local, peers = layout(g)
    out = buf.ravel().copy()
    chunks = split(out, len(local))
    mine = local.index(g.rank)
    if _doubles_inside(len(local)):  # recursive halving leaves chunk ``mine`` here, reduced
        halving_doubling.halve(g, local, mine, chunks, op, bf16)
    else:
        ring.reduce_scatter_chunks(g, local, chunks, op, bf16)
    g.fire("allreduce.mid")
    if len(peers) > RING_ACROSS_MAX:
        chunks[mine][:] = halving_doubling.allreduce_over(g, peers, chunks[mine].copy(), op, bf16, fire=False)
    else:
        across = split(chunks[mine], len(peers))
        ring.reduce_scatter_chunks(g, peers, across, op, bf16)
        ring.allgather_chunks(g, peers, across)  # across are views of chunks[mine]: filled in place
    if _doubles_inside(len(local)):
        halving_doubling.double(g, local, mine, chunks, (mine, mine + 1))
        return np.concatenate(chunks).reshape(buf.shape)
    ring.allgather_chunks(g, local, chunks)
    return out.reshape(buf.shape)


def allreduce_time(
    supernodes: int, local: int, nbytes: float, intra: tuple[float, float], inter: tuple[float, float]
) -> float:
    """Closed form of :func:`allreduce`; ``intra`` and ``inter`` are (latency, bandwidth)."""
    (ai, bi), (ae, be) = intra, inter
    scatter = halving_doubling.reduce_scatter_time if _doubles_inside(local) else ring.reduce_scatter_time
    inside = 2 * scatter(local, nbytes, ai, bi)
    across = halving_doubling.allreduce_time if supernodes > RING_ACROSS_MAX else ring.allreduce_time
    return inside + across(supernodes, nbytes / local, ae, be)
