"""Failures as a Poisson process in virtual time: a fault entry with ``at: {mtbf: DURATION}``.

With ``arrivals: stratified`` beside the mtbf, time is cut into windows one
MTBF long and one failure comes in each, at a point the seed draws (uniform
in the window): the same mean rate as the Poisson process without the noise
in its count, for setting a run beside a formula of expected values (the
ETTR grid, :mod:`testbed.experiments.ettr`; Young/Daly) with a handful of
failures. (Failures exactly one MTBF apart would not do: they resonate with
a checkpoint interval that divides the MTBF, always striking at the same
point of it.)

Inter-arrival times are exponential with mean MTBF, drawn in order from the
fault's own random stream (keyed by the seed and the entry's content, so
adding or moving another fault never changes it), and so is each arrival's
target when the entry gives a selection mode (:mod:`faults.targets`). The k-th arrival's time and
target are therefore the same whatever the policy does: two runs that differ
only in, say, the checkpoint interval face the same failures at the same
virtual times (common random numbers, which is what a sweep needs).

An arrival fires at the first step boundary at or after its time (the
process is stopped while no step runs, so an arrival inside a recovery fires
at the next boundary); arrivals that fall in the same boundary kill each
rank once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from faults.kind import PlannedFault
from faults.targets import draw_ranks
from testbed.core.seeding import stream


@dataclass
class Arrivals:
    """The pending arrivals of one Poisson fault entry."""

    fault: PlannedFault
    rng: np.random.Generator
    next_t: float
    count: int = 0

    @classmethod
    def start(cls, fault: PlannedFault, seed: int) -> Arrivals:
        """The process of ``fault`` (which has ``params.mtbf``), its first arrival drawn."""
        rng = stream(seed, "arrivals", fault.params["stream"])
        mtbf = float(fault.params["mtbf"])
        stratified = fault.params.get("arrivals") == "stratified"
        return cls(fault, rng, float(rng.uniform(0.0, mtbf) if stratified else rng.exponential(mtbf)))

    def _next(self) -> float:
        """The arrival after ``next_t``: an exponential gap, or the seeded point of the next window."""
        mtbf = float(self.fault.params["mtbf"])
        if self.fault.params.get("arrivals") != "stratified":
            return self.next_t + float(self.rng.exponential(mtbf))
        return self.count * mtbf + float(self.rng.uniform(0.0, mtbf))  # window k after k arrivals

    def due(self, now: float, step: int) -> list[PlannedFault]:
        """Every arrival at or before ``now``, as faults to inject before ``step``."""
        out: list[PlannedFault] = []
        while self.next_t <= now:
            self.count += 1
            p = self.fault.params
            ranks = list(p["ranks"]) or draw_ranks(p["target"], p["pool"], self.rng)
            params = {**self.fault.params, "ranks": ranks, "t_arrival": self.next_t}
            out.append(
                dataclasses.replace(
                    self.fault,
                    id=f"{self.fault.id}#{self.count}",
                    rank=ranks[0] if len(ranks) == 1 else -1,
                    step=step,
                    params=params,
                )
            )
            self.next_t = self._next()
        return out
