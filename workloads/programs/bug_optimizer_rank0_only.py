"""Planted bug: only rank 0 writes the optimizer's state.

A guard meant for the weights (``if rank == 0``) wraps the optimizer too; on
load every other rank finds none and keeps a fresh optimizer. The audit must
name ``optimizer``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Program(control_torch.Program):
    def checkpoint(self) -> dict[str, Any]:
        state = super().checkpoint()
        if self.rank != 0:
            del state["optimizer"]
        return state

    def restore(self, state: dict[str, Any]) -> None:
        self.batches = control_torch.Batches(self.sampler, self.data)
        for name, s in self.statefuls.items():
            if name in state and name != "rng":
                s.load_state_dict(state[name])
        self.statefuls["rng"].load_state_dict(state["rng"])


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
