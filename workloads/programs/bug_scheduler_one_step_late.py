"""Planted bug: the scheduler resumes one step late.

The usual shape: the scheduler is rebuilt on resume with
``last_epoch=resumed_step - 1`` where the saved count was already the number
of steps taken. The audit must name ``scheduler``.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import control_torch


class Program(control_torch.Program):
    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.scheduler.last_epoch = int(state["scheduler"]["last_epoch"]) - 1


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
