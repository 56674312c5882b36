"""A program whose load() raises."""

from typing import Any

from workloads.programs import control_numpy


class Program(control_numpy.Program):
    def load(self, folder: str) -> None:
        raise RuntimeError("checkpoint format 2 is not understood")


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
