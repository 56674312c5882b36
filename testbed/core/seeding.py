"""Named random streams derived from the run's root seed.

Every random choice draws from its own stream, keyed by a path of labels
(``("linksetup", epoch, src, dst)``), so adding a consumer never moves another.
"""

from __future__ import annotations

import hashlib

import numpy as np


def stream(seed: int, *labels: object) -> np.random.Generator:
    """A PCG64 generator for ``labels`` under the root ``seed``; the same inputs give the same draws."""
    digest = hashlib.sha256(repr((seed, *labels)).encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
