"""A distributed optimizer (ZeRO stage 1) over one gradient-sync group.

With ``zero: 1`` the data-parallel gradient sync is a reduce-scatter instead
of an allreduce: each rank of the group receives the summed gradient of
``1/n`` of the flattened parameters, keeps Adam's moments for that part only,
updates it, and an allgather returns the updated parameters to every rank
(Rajbhandari et al., "ZeRO", SC 2020, stage 1; Megatron-LM's distributed
optimizer). The optimizer state of a rank is then its shard, and so is what
it checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from workloads.blockspec import Arrays


class ShardedState:
    """One group's flat parameter layout (padded to a multiple of the group size) and this rank's shard."""

    def __init__(self, names: list[str], params: Mapping[str, np.ndarray], size: int, index: int) -> None:
        self.names = names
        self.shapes = {k: params[k].shape for k in names}
        self.length = sum(params[k].size for k in names)
        self.per = math.ceil(self.length / size)
        self.lo = index * self.per
        self.m = np.zeros(self.per, dtype=np.float32)
        self.v = np.zeros(self.per, dtype=np.float32)

    def flatten(self, arrays: Mapping[str, np.ndarray], size: int) -> np.ndarray:
        """The arrays of this group, one after another, zero-padded to ``per x size``."""
        flat = np.zeros(self.per * size, dtype=np.float32)
        offset = 0
        for k in self.names:
            n = arrays[k].size
            flat[offset : offset + n] = arrays[k].ravel()
            offset += n
        return flat

    def unflatten(self, flat: np.ndarray) -> Arrays:
        """The named arrays back from a flat buffer (the padding dropped)."""
        out: Arrays = {}
        offset = 0
        for k in self.names:
            n = math.prod(self.shapes[k])
            out[k] = flat[offset : offset + n].reshape(self.shapes[k]).copy()
            offset += n
        return out

    def mask(self, counted: Mapping[str, bool], size: int) -> np.ndarray:
        """This rank's shard of a flat mask: True where the element counts in the global norm."""
        flat = self.flatten(
            {k: np.full(self.shapes[k], counted[k], dtype=np.float32) for k in self.names}, size
        )
        return flat[self.lo : self.lo + self.per] > 0
