"""Planted bug: the global generator (dropout, the loader's base seed) is not in the checkpoint.

A resumed run draws dropout masks from wherever the fresh process's generator
stands, not where the interrupted run's stood. The audit must name ``rng``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Program(control_torch.Program):
    def checkpoint(self) -> dict[str, Any]:
        return {k: v for k, v in super().checkpoint().items() if k != "rng"}

    def restore(self, state: dict[str, Any]) -> None:
        self.batches = control_torch.Batches(self.sampler, self.data)
        for name, s in self.statefuls.items():
            if name in state:
                s.load_state_dict(state[name])


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
