"""Node faults: an NPU process dies.

``node_kill`` sends a real SIGKILL to the target NPU actor's process, through
the supervising actor of its supernode (the node agent), either at a step
boundary (before the step starts) or in the middle of that step's gradient
allreduce (after the rank has sent its reduce-scatter chunks).
"""

from __future__ import annotations

from typing import Any

from testbed.faultkind import (
    ClusterFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    register,
)

#: ``at.during`` values and the point in the step each one names.
POINTS = {"boundary": "boundary", "allreduce": "allreduce.mid"}


@register
class NodeKill(FaultKind):
    """SIGKILL one NPU's process."""

    name = "node_kill"
    description = "SIGKILL an NPU actor's process, at a step boundary or mid-allreduce"

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> list[tuple[tuple[str | int, ...], str]]:
        """The target must be one rank of the cluster, the step inside the run."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        extra = sorted(set(spec.target) - {"rank"})
        if extra:
            problems.append(
                (
                    ("target", extra[0]),
                    f"unknown target field '{extra[0]}'; node_kill takes 'target: {{rank: N}}'",
                )
            )
        rank = spec.target.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            problems.append((("target",), "node_kill needs 'target: {rank: N}' with an integer rank"))
        elif not 0 <= rank < facts.world:
            problems.append(
                (
                    ("target", "rank"),
                    f"rank {rank} is outside the cluster: ranks are 0..{facts.world - 1}; pick one of those",
                )
            )
        step = spec.at.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            problems.append((("at",), "node_kill needs 'at: {step: N}' with an integer step"))
        elif not 1 <= step <= facts.steps:
            problems.append(
                (
                    ("at", "step"),
                    f"step {step} is outside the run: steps are 1..{facts.steps}; pick one of those",
                )
            )
        during = spec.at.get("during", "boundary")
        if during not in POINTS:
            problems.append(
                (
                    ("at", "during"),
                    f"'during: {during}' is not a point node_kill knows; use one of {', '.join(POINTS)}",
                )
            )
        extra_at = sorted(set(spec.at) - {"step", "during"})
        if extra_at:
            problems.append(
                (("at", extra_at[0]), f"unknown trigger field '{extra_at[0]}'; use step and during")
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """A fixed rank and step need no random draw."""
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=int(spec.target["rank"]),
            step=int(spec.at["step"]),
            point=POINTS[spec.at.get("during", "boundary")],
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Kill now at a boundary, or arm the rank to be killed at its allreduce midpoint."""
        if fault.point == "boundary":
            return injector.kill_now(fault.rank, fault.step)
        injector.arm_kill(fault.rank, fault.step, fault.point)
        return {"armed": fault.point}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A killed process never comes back by itself: recovery replaces it."""
