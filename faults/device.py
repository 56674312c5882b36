"""Device faults: an NPU whose software stack lacks something the model needs.

``unsupported_op`` removes an operator from one rank's device from a step on
(a node left on an older CANN or driver, or a kernel built without an op:
the version-compatibility trap of mixed CANN and driver versions). The model fails at that operator's
first use, naming the operator, the rank and the layer, and every peer that
would wait on that rank is told at once instead of hanging to its timeout.
No restart cures it: the run ends with the job failed.
"""

from __future__ import annotations

from typing import Any, ClassVar

from faults.evidence import Effect, Evidence
from faults.kind import ClusterFacts, FaultKind, FaultSpec, Injector, PlannedFault, Problems, register
from faults.targets import single_rank, target_problems
from testbed.train.step_context import OPERATORS


@register
class UnsupportedOp(FaultKind):
    """One rank's device lacks an operator."""

    name = "unsupported_op"
    description = "a rank's device lacks operator 'op' from a step on; the job fails at its first use"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "op": ("text", "the operator the device lacks (softmax, ...)"),
    }
    params: ClassVar[dict[str, Any]] = {"op": "softmax"}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank, a step inside the run, an operator the workloads use."""
        problems: Problems = target_problems(spec, facts, self.name, single=True)
        step = spec.at.get("step")
        if set(spec.at) != {"step"} or not isinstance(step, int) or isinstance(step, bool):
            problems.append((("at",), "unsupported_op needs 'at: {step: N}' with an integer step"))
        elif not 0 <= step <= facts.steps:
            problems.append((("at", "step"), f"step {step} is outside the run: use 0..{facts.steps}"))
        op = spec.params.get("op", self.params["op"])
        if op not in OPERATORS:
            problems.append(
                (("op",), f"'{op}' is not an operator the workloads use; use one of {', '.join(OPERATORS)}")
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The rank (named or drawn), the step and the operator."""
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=single_rank(spec, seed, facts),
            step=int(spec.at["step"]),
            point="boundary",
            params={"op": str(spec.params.get("op", self.params["op"]))},
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Take the operator away from the rank's device."""
        injector.set_knob([fault.rank], "missing_ops", [fault.params["op"]])
        return {"rank": fault.rank, "op": fault.params["op"]}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A device does not gain an operator back by itself (only an upgrade, outside the run, does)."""

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The rank failed at the operator's first use, or never used it."""
        rank, op = int(fired.get("rank", -1)), fired.get("params", {}).get("op", "?")
        if evidence.failed_with("UnsupportedOperator", rank):
            return Effect(True, f"rank {rank} failed at its first use of {op}")
        return Effect(False, f"rank {rank} never called {op} after it was taken away{evidence.ended_early()}")
