"""A program whose forward pass never returns at its third step."""

import time
from typing import Any

from workloads.programs import control_numpy


class Program(control_numpy.Program):
    def forward_backward(self) -> float:
        if self.optimizer.steps == 2:
            time.sleep(3600)
        return super().forward_backward()


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
