"""A program whose weights start from the operating system's entropy: never the same run twice."""

from typing import Any

import numpy as np

from workloads.programs import control_numpy


class Program(control_numpy.Program):
    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        super().__init__(rank, world, seed, options)
        self.model.params["w2"] += np.random.default_rng().standard_normal((1,)).astype(np.float32)


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
