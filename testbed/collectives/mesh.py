"""Mesh algorithms: direct all-pairs exchange, as inside a full-mesh server.

Every rank talks to every other directly; sends leave one after another on
the sender's egress (staggered: rank ``i`` serves ``i+1, i+2, ...`` first), so
with per-rank egress and one link class (``a``, ``B``; ``S`` the full buffer):

- reduce-scatter: ``a + (n-1)/n · S/B``; allgather: the same (``S`` gathered)
- allreduce = reduce-scatter + allgather: ``2a + 2(n-1)/n · S/B``
- broadcast (the root sends ``S`` to each): ``a + (n-1) · S/B``
- reduce (each sends ``S`` to the root at once): ``a + (n-1) · S/B``, the root's ingress taking
  the buffers one after another (an incast)

Fewer latency terms than the ring, the same bandwidth term: the winner for
small messages where every pair has its own link. (Cost model: Thakur,
Rabenseifner and Gropp, IJHPCA 2005.)
"""

from __future__ import annotations

import numpy as np

from testbed.collectives.group import Group
from testbed.collectives.ops import combine, split


def _others(g: Group) -> list[int]:
    n, i = g.size, g.index
    return [g.ranks[(i + k) % n] for k in range(1, n)]


def reduce_scatter_chunks(g: Group, chunks: list[np.ndarray], op: str, bf16: bool) -> None:
    """In place: ``chunks[index]`` becomes the fully reduced own chunk (summed in rank order)."""
    for dst in _others(g):
        g.send(dst, chunks[g.ranks.index(dst)])
    parts = {src: g.recv(src) for src in _others(g)}
    parts[g.rank] = chunks[g.index]
    acc = parts[g.ranks[0]].copy()
    for src in g.ranks[1:]:
        acc = combine(acc, parts[src], op, bf16)
    chunks[g.index] = acc


def allgather_chunks(g: Group, chunks: list[np.ndarray]) -> None:
    """In place: every member's own chunk reaches every other member directly."""
    for dst in _others(g):
        g.send(dst, chunks[g.index])
    for src in _others(g):
        chunks[g.ranks.index(src)] = g.recv(src)


def allreduce(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Direct reduce-scatter, then direct allgather."""
    chunks = split(buf.ravel(), g.size)
    reduce_scatter_chunks(g, chunks, op, bf16)
    g.fire("allreduce.mid")
    allgather_chunks(g, chunks)
    return np.concatenate(chunks).reshape(buf.shape)


def reduce_scatter(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Direct reduce-scatter: this rank's chunk of the reduced buffer."""
    chunks = split(buf.ravel(), g.size)
    reduce_scatter_chunks(g, chunks, op, bf16)
    return chunks[g.index]


def allgather(g: Group, piece: np.ndarray) -> np.ndarray:
    """Direct allgather."""
    chunks = [piece.ravel() if r == g.rank else np.empty(0, dtype=piece.dtype) for r in g.ranks]
    allgather_chunks(g, chunks)
    return np.concatenate(chunks)


def broadcast(g: Group, buf: np.ndarray, root: int) -> np.ndarray:
    """The root sends the whole buffer to every other rank."""
    if g.rank == root:
        for dst in _others(g):
            g.send(dst, buf)
        return buf.copy()
    return g.recv(root).copy()


def reduce(g: Group, buf: np.ndarray, root: int, op: str, bf16: bool) -> np.ndarray | None:
    """Every rank sends to the root, which reduces in rank order (an incast: the root's ingress takes
    the buffers one after another)."""
    if g.rank != root:
        g.send(root, buf)
        return None
    parts = {src: g.recv(src) for src in g.ranks if src != root}
    parts[root] = buf
    acc = parts[g.ranks[0]].copy()
    for src in g.ranks[1:]:
        acc = combine(acc, parts[src], op, bf16)
    return acc


def allreduce_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`allreduce`."""
    return 2 * a + 2 * (n - 1) / n * nbytes / bw if n > 1 else 0.0


def reduce_scatter_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`reduce_scatter` and :func:`allgather`."""
    return a + (n - 1) / n * nbytes / bw if n > 1 else 0.0


def broadcast_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`broadcast`."""
    return a + (n - 1) * nbytes / bw if n > 1 else 0.0


def reduce_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`reduce`: the ``n - 1`` buffers pass the root's ingress one by one."""
    return a + (n - 1) * nbytes / bw if n > 1 else 0.0
