"""A program whose save() returns having written nothing."""

from typing import Any

from workloads.programs import control_numpy


class Program(control_numpy.Program):
    def save(self, folder: str) -> None:
        return None


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
