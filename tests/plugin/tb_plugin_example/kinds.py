"""A fault kind: one NPU throttles (its compute runs ``factor`` times slower) for some steps."""

from __future__ import annotations

from typing import Any, ClassVar

import testbed
from faults.kind import heal_step, span_problems, step_problems


class ThermalThrottle(testbed.FaultKind):
    """An NPU too hot to run at full clock: slower compute for ``for_steps`` steps, then back."""

    name = "thermal_throttle"
    description = "one rank's compute runs 'factor' times slower for 'for_steps' steps (a hot NPU)"
    targets_ranks = True
    slows_only = True
    triggers: ClassVar[tuple[str, ...]] = ()
    params: ClassVar[dict[str, Any]] = {"factor": 2.0, "for_steps": 1}

    def validate(self, spec: testbed.FaultSpec, facts: testbed.ClusterFacts) -> list[Any]:
        """A rank inside the cluster, a step inside the run, a factor of at least 1."""
        problems = step_problems(spec, facts, self.name, {"boundary": "step.start"}) + span_problems(spec)
        rank = spec.target.get("rank")
        if set(spec.target) != {"rank"} or not isinstance(rank, int) or not 0 <= rank < facts.world:
            problems.append(
                (("target",), f"thermal_throttle targets {{rank: N}} with N in 0..{facts.world - 1}")
            )
        factor = spec.params.get("factor", 2.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            problems.append((("factor",), f"factor must be a number of at least 1, got {factor!r}"))
        return problems

    def plan(self, spec: testbed.FaultSpec, seed: int, facts: testbed.ClusterFacts) -> testbed.PlannedFault:
        """Nothing to draw: the rank, the step and the span are as written."""
        p = {**self.params, **spec.params}
        return testbed.PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=int(spec.target["rank"]),
            step=int(spec.at["step"]),
            point="boundary",
            params={"factor": float(p["factor"]), "for_steps": int(p["for_steps"])},
        )

    def inject(self, injector: testbed.Injector, fault: testbed.PlannedFault) -> dict[str, Any]:
        """Slow the rank down; say when it cools."""
        injector.set_knob([fault.rank], "slowdown", fault.params["factor"])
        return {"factor": fault.params["factor"], "heal_step": heal_step(fault)}

    def heal(self, injector: testbed.Injector, fault: testbed.PlannedFault) -> None:
        """Full clock again."""
        injector.set_knob([fault.rank], "slowdown", 1.0)
