"""Planted bug: the learning-rate scheduler is not in the checkpoint.

The optimizer's learning rate is restored with the optimizer, so the first
resumed step looks right; the scheduler restarts its warm-up from zero at the
next step. The audit must name ``scheduler``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Program(control_torch.Program):
    def checkpoint(self) -> dict[str, Any]:
        return {k: v for k, v in super().checkpoint().items() if k != "scheduler"}

    def restore(self, state: dict[str, Any]) -> None:
        self.batches = control_torch.Batches(self.sampler, self.data)
        for name, s in self.statefuls.items():
            if name in state and name != "rng":
                s.load_state_dict(state[name])
        self.statefuls["rng"].load_state_dict(state["rng"])


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
