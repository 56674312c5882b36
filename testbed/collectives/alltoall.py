"""All-to-all: pairwise exchange, and the direct (mesh) variant.

Rank ``i`` holds ``n`` blocks; block ``j`` goes to rank ``j``. With ``S`` the
bytes a rank sends in all (``S/n`` a block) and one link class (``a``, ``B``):

- pairwise: in round ``k = 1..n-1`` send to ``i+k``, receive from ``i-k``:
  ``(n-1)·(a + S/(n·B))`` (Thakur, Rabenseifner and Gropp, IJHPCA 2005, 4.5)
- mesh: post every send, then every receive: ``a + (n-1) · S/(n·B)``
"""

from __future__ import annotations

import numpy as np

from testbed.collectives.group import Group


def pairwise(g: Group, blocks: list[np.ndarray]) -> list[np.ndarray]:
    """Pairwise exchange; returns the blocks received, in group order."""
    n, i = g.size, g.index
    out = [np.empty(0)] * n
    out[i] = blocks[i].copy()
    for k in range(1, n):
        g.send(g.ranks[(i + k) % n], blocks[(i + k) % n])
        out[(i - k) % n] = g.recv(g.ranks[(i - k) % n]).copy()
    return out


def mesh(g: Group, blocks: list[np.ndarray]) -> list[np.ndarray]:
    """All sends first (staggered), then all receives."""
    n, i = g.size, g.index
    out = [np.empty(0)] * n
    out[i] = blocks[i].copy()
    for k in range(1, n):
        g.send(g.ranks[(i + k) % n], blocks[(i + k) % n])
    for k in range(1, n):
        out[(i - k) % n] = g.recv(g.ranks[(i - k) % n]).copy()
    return out


def pairwise_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`pairwise`; ``nbytes`` is what one rank sends in all (n blocks)."""
    return (n - 1) * (a + nbytes / n / bw)


def mesh_time(n: int, nbytes: float, a: float, bw: float) -> float:
    """Closed form of :func:`mesh`."""
    return a + (n - 1) * nbytes / n / bw if n > 1 else 0.0
