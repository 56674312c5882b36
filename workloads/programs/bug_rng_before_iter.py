"""Planted bug: the generator is restored before the data loader's iterator is created.

Creating the iterator draws its base seed from the global generator (as
PyTorch's DataLoader does), so the restored generator is one draw ahead and
every later dropout mask shifts. The audit must name ``rng``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Program(control_torch.Program):
    def restore(self, state: dict[str, Any]) -> None:
        for name, s in self.statefuls.items():
            s.load_state_dict(state[name])
        self.batches = control_torch.Batches(self.sampler, self.data)  # draws: too late
        self.sampler.base_seed = int(state["sampler"]["base_seed"])


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
