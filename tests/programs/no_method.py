"""A program that has no optimizer_step()."""

from typing import Any

from workloads.programs import control_numpy


class Program(control_numpy.Program):
    optimizer_step = None  # type: ignore[assignment]


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
