"""A numpy program with a module-level step counter that scales its learning rate: state outside
every Stateful, equal right after a load and diverging after it."""

from typing import Any

from workloads.programs import control_numpy

STEPS_TAKEN = 0


class Program(control_numpy.Program):
    def optimizer_step(self) -> None:
        global STEPS_TAKEN
        STEPS_TAKEN += 1
        self.optimizer.step(self.scheduler.lr * (1.0 if STEPS_TAKEN > 2 else 0.5))
        self.scheduler.step()


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    return Program(rank, world, seed, options)
