"""Data faults: the input pipeline falls behind.

``data_stall`` makes each step of the targeted ranks wait ``delay`` virtual
seconds for its batch (a slow dataset mount, a starved loader). The journal
shows the wait per rank and step (``step_end.data_wait_s``); a run whose
steps spend more than 15 % of their time waiting for data gets a warning
(a common rule of thumb: above it, the input pipeline, not the
accelerators, sets the pace).
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence, slowed
from faults.kind import (
    ClusterFacts,
    DrawFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    Problems,
    heal_step,
    on_rank,
    register,
    span_problems,
)
from faults.targets import resolve_ranks, target_problems
from testbed.core.units import parse_duration


@register
class DataStall(FaultKind):
    """Each step of the targeted ranks waits for its input."""

    name = "data_stall"
    targets_ranks = True
    slows_only = True
    drill_order = 2
    description = "each step of a rank (or all ranks) waits 'delay' for its batch, for 'for_steps' steps"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "delay": ("seconds", "how long each step waits for its input"),
    }
    params: ClassVar[dict[str, Any]] = {"delay": "1s", "for_steps": None}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A rank target (:mod:`faults.targets`), a step, a delay, a span."""
        problems: Problems = target_problems(spec, facts, self.name)
        step = spec.at.get("step")
        if (
            set(spec.at) != {"step"}
            or not isinstance(step, int)
            or isinstance(step, bool)
            or not 1 <= step <= facts.steps
        ):
            problems.append((("at",), f"data_stall needs 'at: {{step: N}}' with N in 1..{facts.steps}"))
        delay = spec.params.get("delay", self.params["delay"])
        if parse_duration(delay) is None:
            problems.append(
                (("delay",), f"'{delay}' is not a duration; write '2s', '500ms' or a number of seconds")
            )
        return problems + span_problems(spec)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The ranks, the delay in seconds, the span."""
        ranks = resolve_ranks(spec, seed, facts)
        p = {**self.params, **spec.params}
        params = {"ranks": ranks, "delay_s": parse_duration(p["delay"]), "for_steps": p["for_steps"]}
        rank = ranks[0] if len(ranks) == 1 else -1
        return PlannedFault(
            f"f{spec.index}-{self.name}", self.name, rank, int(spec.at["step"]), "boundary", params
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Slow the input of the ranks from this step."""
        p = fault.params
        injector.set_knob(p["ranks"], "data_delay_s", p["delay_s"])
        heal = heal_step(fault)
        return {"delay_s": p["delay_s"], "heal_step": heal}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """The input pipeline keeps up again."""
        injector.set_knob(fault.params["ranks"], "data_delay_s", 0.0)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """The rank's input delayed 0.1 to 5 s for 1 to 4 steps."""
        step = draw(st.integers(1, facts.steps))
        span = draw(st.integers(1, 4))
        delay = draw(st.sampled_from(["100ms", "1s", "5s"]))
        return {**on_rank(self.name, rank, step), "delay": delay, "for_steps": span}

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The steps the starved ranks ran while it was in force."""
        return slowed(fired, evidence, "input delayed for")
