"""Recursive-doubling allreduce: whole buffers exchanged between partners ``2^k`` apart.

For ``p`` a power of two, ``S`` the buffer, one link class (``a``, ``B``):
``log2(p)·(a + S/B)`` (Thakur, Rabenseifner and Gropp, IJHPCA 2005, 4.4):
half the latency terms of halving-doubling, but the whole buffer crosses
every round, so it wins only for small messages (a TP group's per-layer
allreduce, a gradient norm). In each round the partners add the lower
index's buffer to the higher's, so both hold the same bits. Groups that are
not a power of two fold in first (the first ``2r`` ranks pair up, as in
:mod:`testbed.collectives.halving_doubling`), adding ``2(a + S/B)``.
"""

from __future__ import annotations

import math

import numpy as np

from testbed.collectives.group import Group
from testbed.collectives.halving_doubling import _actual, _core, _virtual
from testbed.collectives.ops import combine


def allreduce(g: Group, buf: np.ndarray, op: str, bf16: bool) -> np.ndarray:
    """Recursive doubling over the power-of-two core, with the fold for the rest."""
    n, i = g.size, g.index
    p, r = _core(n)
    flat = buf.ravel()
    v = _virtual(i, r)
    if v is None:  # sits out: hand over, wait for the result
        g.send(g.ranks[i + 1], flat)
        g.fire("allreduce.mid")
        return g.recv(g.ranks[i + 1]).reshape(buf.shape)
    if i < 2 * r:
        flat = combine(g.recv(g.ranks[i - 1]), flat, op, bf16)
    core = [g.ranks[_actual(k, r)] for k in range(p)]
    d = 1
    while d < p:
        partner = core[v ^ d]
        g.send(partner, flat)
        got = g.recv(partner)
        flat = combine(flat, got, op, bf16) if v & d == 0 else combine(got, flat, op, bf16)
        if d == 1:
            g.fire("allreduce.mid")
        d *= 2
    if i < 2 * r:
        g.send(g.ranks[i - 1], flat)
    return flat.reshape(buf.shape)  # a new array: every round's combine made one


def allreduce_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`allreduce` (the slowest rank); an upper bound when ``n`` is no power of two.

    (There the fold overlaps the first round whenever the partner needs no fold.)
    """
    if n == 1:
        return 0.0
    p, r = _core(n)
    return math.log2(p) * (a + nbytes / bw) + (2 * (a + nbytes / bw) if r else 0.0)
