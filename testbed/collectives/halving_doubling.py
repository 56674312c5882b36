"""Recursive halving and doubling (Rabenseifner's allreduce) and the binomial-tree broadcast.

For ``p`` a power of two, ``S`` the full buffer, one link class (``a``, ``B``),
from Thakur, Rabenseifner and Gropp (IJHPCA 2005, section 4.4) and
Rabenseifner (ICCS 2004):

- reduce-scatter by recursive halving: ``log2(p)·a + (p-1)/p · S/B``
- allgather by recursive doubling: ``log2(p)·a + (p-1)/p · S/B``
- allreduce = both: ``2·log2(p)·a + 2(p-1)/p · S/B``
- binomial-tree broadcast: ``log2(n)·(a + S/B)`` for ``n`` a power of two (the
  path 0 -> 1 -> 3 -> 7 ...); an upper bound otherwise

When ``n`` is not a power of two, with ``p = 2^floor(log2 n)`` and ``r = n - p``,
the first ``2r`` ranks pair up: each even one hands its whole buffer to its
odd neighbour before, and gets the result back after, adding ``2(a + S/B)``.
"""

from __future__ import annotations

import math

import numpy as np

from testbed.collectives.group import Group
from testbed.collectives.ops import combine, split
from testbed.core.errors import TestbedError


def _core(n: int) -> tuple[int, int]:
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def _virtual(i: int, r: int) -> int | None:
    """Index among the ``p`` ranks of the power-of-two core, or None for a rank that sits out."""
    if i < 2 * r:
        return i // 2 if i % 2 else None
    return i - r


def _actual(v: int, r: int) -> int:
    return 2 * v + 1 if v < r else v + r


def halve(
    g: Group, core: list[int], v: int, chunks: list[np.ndarray], op: str, bf16: bool
) -> tuple[int, int]:
    """Recursive halving over ``core`` (a power of two), ``v`` this rank's index in it: chunk ``v``
    reduced here; the range of chunks owned (a hierarchical allreduce's step inside a supernode)."""
    return _halving(g, core, v, chunks, op, bf16)


def double(g: Group, core: list[int], v: int, chunks: list[np.ndarray], owned: tuple[int, int]) -> None:
    """Recursive doubling over ``core`` from the ``owned`` chunks: afterwards every chunk is here."""
    _doubling(g, core, v, chunks, owned)


def _halving(
    g: Group, core: list[int], v: int, chunks: list[np.ndarray], op: str, bf16: bool
) -> tuple[int, int]:
    """Recursive halving over ``core``; returns the chunk range [lo, hi) this rank now owns, reduced."""
    p = len(core)
    lo, hi = 0, p
    d = p // 2
    while d >= 1:
        partner = core[v ^ d]
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if v & d == 0 else ((mid, hi), (lo, mid))
        g.send(partner, np.concatenate(chunks[give[0] : give[1]]))
        got = g.recv(partner)
        offset = 0
        for j in range(*keep):
            size = chunks[j].size
            chunks[j] = combine(chunks[j], got[offset : offset + size], op, bf16)
            offset += size
        lo, hi = keep
        d //= 2
    return lo, hi


def _doubling(g: Group, core: list[int], v: int, chunks: list[np.ndarray], owned: tuple[int, int]) -> None:
    """Recursive doubling over ``core``: afterwards every chunk is everywhere."""
    p = len(core)
    lo, hi = owned
    d = 1
    while d < p:
        partner = core[v ^ d]
        g.send(partner, np.concatenate(chunks[lo:hi]))
        got = g.recv(partner)
        width = hi - lo
        plo = lo - width if v & d else hi
        offset = 0
        for j in range(plo, plo + width):
            size = chunks[j].size
            chunks[j] = got[offset : offset + size].copy()
            offset += size
        lo, hi = min(lo, plo), max(hi, plo + width)
        d *= 2


def allreduce(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Rabenseifner allreduce, with the pairing step for non-power-of-two groups."""
    return allreduce_over(g, g.ranks, buf.ravel().copy(), op, bf16).reshape(buf.shape)


def allreduce_over(
    g: Group, members: list[int], flat: np.ndarray, op: str, bf16: bool, fire: bool = True
) -> np.ndarray:
    """Rabenseifner allreduce of ``flat`` among ``members`` of ``g`` (all of them, or the same-position
    peers of a hierarchical allreduce); ``fire`` marks its middle as the ``allreduce.mid`` point."""
    n, i = len(members), members.index(g.rank)
    p, r = _core(n)
    v = _virtual(i, r)
    if i < 2 * r and v is None:  # sits out: hand over, wait for the result
        g.send(members[i + 1], flat)
        if fire:
            g.fire("allreduce.mid")
        return g.recv(members[i + 1])
    if i < 2 * r:
        flat = combine(g.recv(members[i - 1]), flat, op, bf16)
    core = [members[_actual(k, r)] for k in range(p)]
    chunks = split(flat, p)  # only read; reductions make new arrays
    assert v is not None
    owned = _halving(g, core, v, chunks, op, bf16)
    if fire:
        g.fire("allreduce.mid")
    _doubling(g, core, v, chunks, owned)
    out = np.concatenate(chunks)
    if i < 2 * r:
        g.send(members[i - 1], out)
    return out


def _power_of_two(g: Group, what: str) -> None:
    if g.size & (g.size - 1):
        raise TestbedError(
            f"{what} by halving-doubling needs a power-of-two group, not {g.size} ranks; use ring or mesh",
            size=g.size,
        )


def reduce_scatter(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Recursive-halving reduce-scatter (power-of-two groups): this rank's chunk."""
    _power_of_two(g, "reduce-scatter")
    chunks = split(buf.ravel(), g.size)
    lo, _ = _halving(g, g.ranks, g.index, chunks, op, bf16)
    return chunks[lo]


def allgather(g: Group, piece: np.ndarray) -> np.ndarray:
    """Recursive-doubling allgather (power-of-two groups; equal pieces, as MPI_Allgather)."""
    _power_of_two(g, "allgather")
    chunks = [piece.ravel().copy() for _ in g.ranks]
    _doubling(g, g.ranks, g.index, chunks, (g.index, g.index + 1))
    return np.concatenate(chunks)


def broadcast(g: Group, buf: np.ndarray, root: int) -> np.ndarray:
    """Binomial tree from ``root``: in round ``k`` every holder sends to the rank ``2^k`` further on."""
    n = g.size
    rel = (g.index - g.ranks.index(root)) % n
    out = buf.copy() if rel == 0 else None
    mask = 1
    while mask < n:
        if rel < mask and rel + mask < n:
            assert out is not None
            g.send(g.ranks[(g.ranks.index(root) + rel + mask) % n], out)
        elif mask <= rel < 2 * mask:
            out = g.recv(g.ranks[(g.ranks.index(root) + rel - mask) % n])
        mask *= 2
    assert out is not None
    return out


def allreduce_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`allreduce` (the slowest rank)."""
    if n == 1:
        return 0.0
    p, r = _core(n)
    core = 2 * math.log2(p) * a + 2 * (p - 1) / p * nbytes / bw
    return core + (2 * (a + nbytes / bw) if r else 0.0)


def reduce_scatter_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`reduce_scatter` (power-of-two ``n``)."""
    return math.log2(n) * a + (n - 1) / n * nbytes / bw if n > 1 else 0.0


def broadcast_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`broadcast`."""
    return math.ceil(math.log2(n)) * (a + nbytes / bw) if n > 1 else 0.0
