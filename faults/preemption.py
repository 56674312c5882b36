"""Preemption: the node is reclaimed, with notice (a spot instance, a higher-priority job).

``preempt`` sends a real SIGTERM to the target NPU processes (through their
supernode's supervisor) at a point of a step: the boundary before it, the
forward or backward pass, the middle of its first allreduce, half-way
through the rank's shard of the first checkpoint at or after it, or half-way
through its load in the restart after a failure of the step. The
target is a rank, a supernode (one host gets the notice) or a selection
mode (``{mode: all}``: every host). The window from SIGTERM to SIGKILL is
the smallest of ``notice_s`` (the provider's notice), ``grace_s`` (the
scheduler's grace) and the launcher's timeout; each falls back to
``policy.preemption`` (30 s each without it). What the job does with its
notice is ``policy.preemption.on_notice`` (:mod:`testbed.control.preemption`);
the ranks noticed leave the job for good, as their node is reclaimed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence, point_text, ranks_text
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
from faults.targets import resolve_ranks, target_problems
from testbed.core.units import parse_duration

#: ``at.during`` values and the point of the step each one names
POINTS = {
    "boundary": "step.start",
    "forward": "forward",
    "backward": "backward",
    "allreduce": "allreduce.mid",
    "checkpoint": "shard.mid",
    "load": "load.mid",
}

#: the fields that shorten the window, each in seconds
WINDOW_FIELDS = ("notice_s", "grace_s")


def _window_problems(spec: FaultSpec) -> Problems:
    """``notice_s`` and ``grace_s``, when given, are positive durations."""
    problems: Problems = []
    for name in WINDOW_FIELDS:
        if name not in spec.params:
            continue
        raw = spec.params[name]
        value = parse_duration(raw) if not isinstance(raw, bool) else None
        if value is None or value <= 0:
            problems.append(
                (
                    (name,),
                    f"{name} must be a positive duration like 30 or '2m' (the time from SIGTERM to SIGKILL "
                    f"cannot be zero or less), got {raw!r}",
                )
            )
    return problems


def notices(faults: Iterable[FaultSpec]) -> list[FaultSpec]:
    """The ``preempt`` entries of ``faults`` at a step, as written (not a repeated entry's firings)."""
    at_step = [f for f in faults if isinstance(f.at.get("step"), int) and not f.origin]
    return [f for f in at_step if f.kind == Preempt.name]


@register
class Preempt(FaultKind):
    """A real SIGTERM to NPU processes, then SIGKILL when their window runs out."""

    name = "preempt"
    ends_process = True
    real_failure = True
    targets_ranks = True
    drill_order = 9
    description = (
        "SIGTERM NPU processes (a rank, a host, every host) at a point of a step; SIGKILL when the notice, "
        "the grace or the launcher's timeout runs out; policy.preemption.on_notice says what the job does"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "notice_s": ("seconds", "the provider's notice (AWS Spot 120 s, GCE Spot 30 s); else the policy's"),
        "grace_s": ("seconds", "the scheduler's grace from SIGTERM to SIGKILL; else the policy's"),
    }
    params: ClassVar[dict[str, Any]] = {"notice_s": None, "grace_s": None}
    triggers: ClassVar[tuple[str, ...]] = ("every", "time")

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A rank target (:mod:`faults.targets`), a step inside the run and a point, positive windows."""
        return (
            target_problems(spec, facts, self.name)
            + step_problems(spec, facts, self.name, POINTS)
            + _window_problems(spec)
        )

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The ranks noticed, the step and point, and the windows the entry sets."""
        ranks = resolve_ranks(spec, seed, facts, self.name)
        step, point = point_of(spec, facts, POINTS)
        windows = {n: parse_duration(spec.params[n]) for n in WINDOW_FIELDS if spec.params.get(n) is not None}
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=ranks[0] if len(ranks) == 1 else -1,
            step=step,
            point=point,
            params={"ranks": ranks, **windows},
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Arm each rank to ask for its SIGTERM at the point; say the window and the policy."""
        return injector.arm_preempt(fault.id, fault.params["ranks"], fault.step, fault.point, fault.params)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """A notice to the rank at a boundary or mid-step, before the last step, with a window of a
        few microseconds: shorter than any step a base may have (a drill base's steps take
        microseconds of virtual time), so the SIGKILL always lands before the run ends."""
        step = draw(st.integers(1, max(1, facts.steps - 1)))
        during = draw(st.sampled_from(["boundary", "forward", "allreduce"]))
        grace = draw(st.sampled_from([1e-6, 4e-6]))
        return {
            "kind": self.name,
            "target": {"rank": rank},
            "at": {"step": step, "during": during},
            "grace_s": grace,
        }

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Noticed when each rank's SIGTERM was sent (and its handler ran) at its point."""
        ranks = fired.get("params", {}).get("ranks") or [fired.get("rank", -1)]
        step, point = int(fired.get("step", 0)), str(fired.get("point", "step.start"))
        noticed = sorted(
            {
                int(e["rank"])
                for e in evidence.events
                if e.get("event") == "preempt_notice" and e.get("fault") == fired.get("id")
            }
        )
        where = f"{point_text(point)} of step {step}"
        if not noticed:
            return Effect(False, f"{ranks_text(ranks)} never reached {where}{evidence.ended_early()}")
        missed = sorted(set(ranks) - set(noticed))
        return Effect(
            True,
            f"SIGTERM to {ranks_text(noticed)} {where}"
            + (f"; {ranks_text(missed)} never got there" if missed else ""),
        )
