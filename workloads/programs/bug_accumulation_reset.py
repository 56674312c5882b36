"""Planted bug: the gradient-accumulation counter restarts at zero on resume.

Saved mid-window, the resumed run starts a new window: the micro-step already
taken is lost and the next optimizer step comes one micro-step late. Only a
resume from inside a window shows it. The audit must name ``accumulation``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Accumulation(control_torch.Accumulation):
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = 0
        self.model.zero_grad(set_to_none=False)


class Program(control_torch.Program):
    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        super().__init__(rank, world, seed, options)
        self.accumulation = self.statefuls["accumulation"] = Accumulation(self.model)


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
