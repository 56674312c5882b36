"""Ring algorithms (and the chain for rooted collectives).

Contention-free virtual time, ``n`` ranks, ``S`` bytes of the full buffer, one
link class of latency ``a`` and bandwidth ``B`` (Thakur, Rabenseifner and
Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 2005, section 4):

- reduce-scatter: ``(n-1)·a + (n-1)/n · S/B``
- allgather (``S`` the gathered size): ``(n-1)·a + (n-1)/n · S/B``
- allreduce = reduce-scatter + allgather: ``2(n-1)·a + 2(n-1)/n · S/B``
- broadcast and reduce along the chain from / to the root: ``(n-1)·(a + S/B)``
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from testbed.collectives.group import Group
from testbed.collectives.ops import UFUNCS, combine, split
from testbed.fabric.frames import FOLD_PIECE, Fold


def reduce_scatter_chunks(
    g: Group,
    members: list[int],
    chunks: list[np.ndarray],
    op: str,
    bf16: bool,
    into: list[np.ndarray] | None = None,
) -> None:
    """Afterwards member ``i`` holds its own chunk fully reduced, in ``into[i]`` (default ``chunks[i]``).

    Each incoming chunk is combined with this rank's chunk straight into
    ``into`` (writable views; ``chunks`` are only read) piece by piece as it
    arrives, through a buffer small enough to stay in the CPU's cache
    (:class:`~testbed.fabric.frames.Fold`), so the only copies are the
    sockets' own and no chunk-sized scratch is written and read back. A chunk
    this rank reduced is the one it sends on the next step.
    """
    out = chunks if into is None else into
    n = len(members)
    i = members.index(g.rank)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    scratch = np.empty(max((c.size for c in chunks), default=0), dtype=chunks[0].dtype)
    piece = np.empty(max(min(FOLD_PIECE, scratch.nbytes), scratch.itemsize), dtype=np.uint8).data
    for s in range(n - 1):
        g.send(nxt, chunks[(i - 1) % n] if s == 0 else out[(i - s - 1) % n])
        j = (i - s - 2) % n
        room = scratch[: chunks[j].size]
        if bf16:
            out[j][...] = combine(chunks[j], g.recv_into(prv, room), op, bf16)
        else:
            g.recv_into(prv, room, Fold(_combine_into(chunks[j], out[j], op), piece))


def _combine_into(mine: np.ndarray, out: np.ndarray, op: str) -> Callable[[memoryview, int], None]:
    """What a fold does with each piece of a peer's chunk: ``out = mine op piece``, element-wise over
    the piece's elements (``offset`` counts bytes)."""
    ufunc, size = UFUNCS[op], mine.dtype.itemsize

    def apply(piece: memoryview, offset: int) -> None:
        values = np.frombuffer(piece, dtype=mine.dtype)
        first = offset // size
        end = first + values.size
        ufunc(mine[first:end], values, out=out[first:end])

    return apply


def allgather_chunks(g: Group, members: list[int], chunks: list[np.ndarray]) -> None:
    """Member ``i`` contributes ``chunks[i]``; every other chunk is received straight into its view."""
    n = len(members)
    i = members.index(g.rank)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    for s in range(n - 1):
        g.send(nxt, chunks[(i - s) % n])
        g.recv_into(prv, chunks[(i - s - 1) % n])


def allreduce(g: Group, buf: np.ndarray, op: str, bf16: bool, out: np.ndarray | None = None) -> np.ndarray:
    """Ring allreduce: reduce-scatter, then allgather, into one output buffer, ``out`` when given (of
    ``buf``'s shape and type, contiguous; ``buf`` itself for an allreduce in place). A chunk a peer
    was sent is overwritten only once that peer has read it: the ring's order sees to it."""
    result = np.empty(buf.shape, dtype=buf.dtype) if out is None else out
    chunks = split(result.reshape(-1), g.size)
    reduce_scatter_chunks(g, g.ranks, split(buf.ravel(), g.size), op, bf16, into=chunks)
    g.fire("allreduce.mid")
    allgather_chunks(g, g.ranks, chunks)
    return result


def reduce_scatter(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Ring reduce-scatter: this rank's chunk (``np.array_split`` order) of the reduced buffer."""
    chunks = split(buf.ravel().copy(), g.size)
    reduce_scatter_chunks(g, g.ranks, chunks, op, bf16)
    return chunks[g.index]


def allgather(g: Group, piece: np.ndarray) -> np.ndarray:
    """Ring allgather: every member's (equal-length) piece, concatenated in group order."""
    out = np.empty(piece.size * g.size, dtype=piece.dtype)
    chunks = np.split(out, g.size)
    chunks[g.index][...] = piece.ravel()
    allgather_chunks(g, g.ranks, chunks)
    return out


def broadcast(g: Group, buf: np.ndarray, root: int) -> np.ndarray:
    """Chain broadcast from ``root`` along the ring order."""
    order = g.ranks[g.ranks.index(root) :] + g.ranks[: g.ranks.index(root)]
    k = order.index(g.rank)
    out = buf.copy() if k == 0 else g.recv(order[k - 1]).copy()
    if k + 1 < len(order):
        g.send(order[k + 1], out)
    return out


def reduce(g: Group, buf: np.ndarray, root: int, op: str, bf16: bool) -> np.ndarray | None:
    """Chain reduce towards ``root``: the farthest rank starts, each adds its own and passes on."""
    order = g.ranks[g.ranks.index(root) + 1 :] + g.ranks[: g.ranks.index(root) + 1]
    k = order.index(g.rank)
    acc = buf.copy() if k == 0 else combine(g.recv(order[k - 1]), buf, op, bf16)
    if k + 1 < len(order):
        g.send(order[k + 1], acc)
        return None
    return acc


def allreduce_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`allreduce`."""
    return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw if n > 1 else 0.0


def reduce_scatter_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`reduce_scatter` (and of :func:`allgather` with ``nbytes`` gathered)."""
    return (n - 1) * a + (n - 1) / n * nbytes / bw if n > 1 else 0.0


def chain_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`broadcast` and :func:`reduce`."""
    return (n - 1) * (a + nbytes / bw)
