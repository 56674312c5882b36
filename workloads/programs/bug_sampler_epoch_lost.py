"""Planted bug: the sampler's epoch is not restored, only its position in the epoch.

A run resumed in its second epoch replays the first epoch's order. The audit
must name ``sampler``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Sampler(control_torch.Sampler):
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.base_seed = int(state["position"]), int(state["base_seed"])


class Program(control_torch.Program):
    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        super().__init__(rank, world, seed, options)
        sampler = Sampler(seed, rank, world)
        sampler.load_state_dict(self.sampler.state_dict())
        self.sampler = self.batches.sampler = self.statefuls["sampler"] = sampler


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
