"""The control plane's own failures: the process that drives the run is killed.

``controller_kill`` SIGKILLs the controller (the driver process of the run,
which holds the journal, the plan and every rank's handle) at a point: the
boundary before a step, while the ranks run it (``during: step``),
mid-commit of the first checkpoint at or after it (its shards and manifest
written, not yet renamed into place), or in the middle of the first restart
from storage at or after it (the ranks restarted and linked, the checkpoint
not loaded). Its Ray actors and NPU processes die with it, as a job's
workers do when their launcher goes. ``testbed resume RUN_DIR`` then goes on from the journal and
the committed checkpoints; ``testbed run`` does that by itself after a kill
it injected, so the scenario rehearses the whole cycle. ``torn: true`` leaves
a half-written journal line behind, as a kill in the middle of a write does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence, point_text
from faults.kind import (
    ClusterFacts,
    DrawFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    Problems,
    point_of,
    register,
    step_problems,
)


def kills_controller(faults: Iterable[FaultSpec]) -> bool:
    """Whether any of ``faults`` kills the run's controller (then a process of its own hosts the run)."""
    return any(f.kind == ControllerKill.name for f in faults)


#: ``at.during`` values and the point each names (``step``: while the ranks run the step, its calls on
#: their way and no answer in; ``checkpoint``: the first checkpoint at or after the
#: step, its manifest written and its rename, which commits it, not yet done; ``recovery``: the first
#: restart from storage at or after the step, its ranks restarted and linked, its checkpoint not loaded)
POINTS = {
    "boundary": "step.start",
    "step": "step.running",
    "checkpoint": "manifest.written",
    "recovery": "recovery.relinked",
}


@register
class ControllerKill(FaultKind):
    """A real SIGKILL to the run's controller process; the run is resumed from its journal."""

    name = "controller_kill"
    ends_process = True
    real_failure = True
    drill_order = 10
    description = (
        "SIGKILL the run's controller (its driver process) at a step boundary, mid-commit of a "
        "checkpoint or mid-recovery; testbed resume goes on from the journal and the committed checkpoints"
    )
    params: ClassVar[dict[str, Any]] = {"torn": False}
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "torn": ("boolean", "leave a half-written journal line, as a kill mid-write does"),
    }
    triggers: ClassVar[tuple[str, ...]] = ()

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """No target (there is one controller), a step inside the run and a point, a yes/no ``torn``."""
        problems: Problems = step_problems(spec, facts, self.name, POINTS)
        if spec.target:
            problems.append(
                (("target",), "controller_kill has no target (the run has one controller); remove it")
            )
        torn = spec.params.get("torn", False)
        if not isinstance(torn, bool):
            problems.append((("torn",), f"torn must be true or false, got {torn!r}"))
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The step and the point; ``torn`` when set."""
        step, point = point_of(spec, facts, POINTS)
        params = {"torn": True} if spec.params.get("torn") else {}
        return PlannedFault(f"f{spec.index}-{self.name}", self.name, -1, step, point, params)

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Arm the kill: at the boundary it comes as soon as the injection is journalled; mid-step, once
        the step's calls are on their way to the ranks; mid-commit, when the checkpoint's manifest is
        written; mid-recovery, when the restart has linked."""
        injector.arm_controller_kill(fault.id, fault.point, bool(fault.params.get("torn")))
        return {"armed": fault.point}

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """A kill at a boundary or mid-step before the last step, or mid-commit of a checkpoint; torn
        or not."""
        torn = draw(st.booleans())
        if facts.checkpoints and draw(st.booleans()):
            step = draw(st.sampled_from(facts.checkpoints))
            return {"kind": self.name, "at": {"step": step, "during": "checkpoint"}, "torn": torn}
        step = draw(st.integers(1, max(1, facts.steps - 1)))
        during = draw(st.sampled_from(["boundary", "step"]))
        return {"kind": self.name, "at": {"step": step, "during": during}, "torn": torn}

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Killed when the controller journalled its kill at the point; else it never got there."""
        where = point_text(str(fired.get("point", "step.start")))
        for e in evidence.events:
            if e.get("event") == "controller_killed" and e.get("fault") == fired.get("id"):
                return Effect(True, f"SIGKILL to the controller {where}")
        return Effect(False, f"the controller never reached its point ({where}){evidence.ended_early()}")
