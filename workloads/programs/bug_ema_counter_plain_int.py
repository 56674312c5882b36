"""Planted bug: the EMA's update counter is a plain attribute its state_dict leaves out.

Its shadow weights are saved and restored, so the state looks whole right
after the load; the decay then warms up again from zero and the average
drifts from the next update on. The audit must name ``ema``, as hidden state.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class EMA(control_torch.EMA):
    def state_dict(self) -> dict[str, Any]:
        return {"shadow": dict(self.shadow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)


class Program(control_torch.Program):
    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        super().__init__(rank, world, seed, options)
        self.ema = self.statefuls["ema"] = EMA(self.model)


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
