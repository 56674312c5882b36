"""Planted bug: the seed is applied again after the checkpoint is loaded.

A common shape: ``load()`` then ``seed_everything(seed)`` in the resume path,
which throws the restored generator state away. The audit must name ``rng``.
"""

from __future__ import annotations

from typing import Any

import torch

from workloads.programs import control_torch


class Program(control_torch.Program):
    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        super().__init__(rank, world, seed, options)
        self.seed = seed

    def load(self, folder: str) -> None:
        super().load(folder)
        torch.manual_seed(self.seed * 1000 + self.rank + 1)


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
