"""Node faults: NPU processes die.

``node_kill`` sends a real SIGKILL to the target NPU actors' processes,
through the supervising actor of their supernode (the node agent), at a
point of a step (``during``): the boundary before it, the start of the
forward or of the backward pass, the middle of its first allreduce (after
the rank has sent its first chunks), or half-way through the rank's shard of
the first checkpoint at or after the step. The target is a rank, a whole
supernode (every NPU of it at once: a supernode lost), or a selection mode
(:mod:`faults.targets`: ``one``, ``all``, ``fixed``, ``fixed-percent``,
``random-max-percent``) drawn from the fault's own stream. With ``at: {mtbf:
DURATION}`` instead of a step, kills come as a Poisson process in virtual
time (:mod:`faults.arrivals`; ``arrivals: stratified`` for exactly one in
each MTBF-long window): a mode target is drawn anew at each arrival.
With ``scope: ray_node`` (a supernode target, at a boundary) the supernode's
whole Ray node is lost: its raylet is SIGKILLed, and every process on it
dies with it (only on a multi-node Ray cluster, where each supernode has a
node of its own).
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence, point_text, ranks_text, slowed
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
    point_of,
    register,
    span_problems,
    step_problems,
)
from faults.targets import pool_of, resolve_ranks, single_rank, target_problems
from testbed.core.units import parse_duration
from testbed.serve.colocation import Window

#: ``at.during`` values and the point in the step each one names.
POINTS = {
    "boundary": "boundary",
    "forward": "forward",
    "backward": "backward",
    "allreduce": "allreduce.mid",
    "checkpoint": "shard.mid",
}


#: How the failures of ``at: {mtbf: ...}`` arrive (:mod:`faults.arrivals`).
ARRIVALS = ("poisson", "stratified")


def _mtbf_problems(spec: FaultSpec) -> Problems:
    """``at: {mtbf: DURATION[, arrivals: poisson|stratified]}``: a positive duration, nothing else."""
    problems: Problems = []
    mtbf = parse_duration(spec.at["mtbf"])
    if mtbf is None or mtbf <= 0:
        problems.append(
            (
                ("at", "mtbf"),
                f"mtbf must be a positive duration like 3600 or '1h', or 'job' (the job section's "
                f"failure rate), got {spec.at['mtbf']!r}",
            )
        )
    arrivals = spec.at.get("arrivals", "poisson")
    if arrivals not in ARRIVALS:
        problems.append(
            (
                ("at", "arrivals"),
                f"arrivals must be poisson (exponential gaps, the default) or stratified (one failure in "
                f"each mtbf-long window, at a seeded point of it), got {arrivals!r}",
            )
        )
    extra = sorted(set(spec.at) - {"mtbf", "arrivals"})
    if extra:
        problems.append(
            (
                ("at", extra[0]),
                f"'{extra[0]}' cannot go with mtbf: a Poisson process kills at step boundaries",
            )
        )
    return problems


@register
class NodeKill(FaultKind):
    """SIGKILL one NPU's process, every NPU of a supernode, or a rank the seed picks."""

    name = "node_kill"
    ends_process = True
    serves = True
    real_failure = True
    drill_order = 0
    description = (
        "SIGKILL NPU processes (a rank, a supernode, or ranks a mode draws) at a boundary, in the forward "
        "or backward pass, mid-allreduce or mid-checkpoint, or as a Poisson process"
    )
    targets_ranks = True
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "scope": (
            "process|ray_node",
            "process: SIGKILL the NPU processes; ray_node: lose the supernode's whole Ray node",
        ),
    }
    #: ``scope: ray_node`` takes a supernode's whole Ray node down (multi-node Ray clusters only)
    params: ClassVar[dict[str, Any]] = {"scope": "process"}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A rank target (:mod:`faults.targets`); a step inside the run and a point, or an mtbf."""
        t = spec.target
        problems = target_problems(spec, facts, self.name)
        scope = spec.params.get("scope", "process")
        if scope not in ("process", "ray_node"):
            problems.append((("scope",), f"scope must be process or ray_node, got {scope!r}"))
        elif scope == "ray_node" and (
            set(t) != {"supernode"} or spec.at.get("during", "boundary") != "boundary"
        ):
            problems.append(
                (
                    ("scope",),
                    "scope: ray_node loses a supernode's whole Ray node: give 'target: {supernode: N}' and a "
                    "step boundary (no 'during')",
                )
            )
        if "mtbf" in spec.at:
            return problems + _mtbf_problems(spec)
        return problems + step_problems(spec, facts, self.name, POINTS)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The ranks to kill: the one named, the supernode's, or those the mode draws from the seed.

        With ``at.mtbf`` the fault is a Poisson process (:mod:`faults.arrivals`):
        step 0 and ``params.mtbf``; a mode target is drawn anew at each arrival.
        """
        t = spec.target
        if "mtbf" in spec.at:
            fixed = resolve_ranks(spec, seed, facts) if "mode" not in t else []
            return PlannedFault(
                id=f"f{spec.index}-{self.name}",
                kind=self.name,
                rank=-1,
                step=0,
                point="boundary",
                params={
                    "ranks": fixed,
                    "mtbf": parse_duration(spec.at["mtbf"]),
                    "target": dict(t),
                    "pool": pool_of(spec, facts),
                    "stream": spec.stream_key(),
                    # only when asked: a Poisson entry's plan (and its digest) stays as it was
                    **({"arrivals": "stratified"} if spec.at.get("arrivals") == "stratified" else {}),
                },
            )
        ranks = resolve_ranks(spec, seed, facts, "node_kill")
        step, point = point_of(spec, facts, POINTS)
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=ranks[0] if len(ranks) == 1 else -1,
            step=step,
            point=point,
            params={"ranks": ranks, **({"supernode": int(t["supernode"])} if set(t) == {"supernode"} else {})}
            | {"scope": spec.params.get("scope", "process")},
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Kill now at a boundary, or arm each rank to be killed at its allreduce midpoint."""
        ranks = fault.params["ranks"]
        if fault.params.get("scope") == "ray_node":
            return injector.lose_ray_node(int(fault.params["supernode"]), fault.step)
        if fault.point == "boundary":
            records = [injector.kill_now(r, fault.step) for r in ranks]
            return records[0] if len(records) == 1 else {"ranks": ranks, "killed": records}
        for r in ranks:
            injector.arm_kill(r, fault.step, fault.point)
        return {"armed": fault.point, "ranks": ranks}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A killed process never comes back by itself: recovery replaces it."""

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """A kill of the rank or of one drawn rank, at any point of a step."""
        step = draw(st.integers(1, facts.steps))
        target = draw(st.sampled_from([{"rank": rank}, {"mode": "one"}]))
        during = draw(st.sampled_from(["boundary", "allreduce", "forward", "backward"]))
        return {"kind": self.name, "target": target, "at": {"step": step, "during": during}}

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Killed at once (a boundary, a Ray node), or when each armed rank reached its point."""
        record, ranks = (
            fired.get("record", {}),
            fired.get("params", {}).get("ranks") or [fired.get("rank", -1)],
        )
        step, point = int(fired.get("step", 0)), str(fired.get("point", "boundary"))
        if record.get("point") == "ray_node":
            return Effect(
                True, f"lost the Ray node of supernode {record.get('supernode')}, {ranks_text(ranks)}"
            )
        if "armed" not in record:
            return Effect(True, f"killed {ranks_text(ranks)} at the boundary of step {step}")
        dead = sorted({d["rank"] for d in evidence.deaths(ranks, step, point)})
        where = f"{point_text(point)} of step {step}"
        if not dead:
            return Effect(False, f"{ranks_text(ranks)} never reached {where}{evidence.ended_early()}")
        missed = sorted(set(ranks) - set(dead))
        return Effect(
            True,
            f"killed {ranks_text(dead)} {where}"
            + (f"; {ranks_text(missed)} never got there" if missed else ""),
        )


@register
class Straggler(FaultKind):
    """Slow an NPU's compute by a factor (thermal throttling, a degraded chip)."""

    name = "straggler"
    slows_only = True
    serves = True
    drill_order = 1
    description = "multiply the compute time of ranks (a rank, a supernode's, a mode's) by 'factor'"
    targets_ranks = True
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "factor": ("number", "how many times longer the rank's compute takes (above 1)"),
        "duration": ("seconds", "serving: how long the instance is slowed (none: for good)"),
    }
    #: ``duration``: in a serving run, how long the instance stays slow (None: to the end)
    params: ClassVar[dict[str, Any]] = {"factor": 2.0, "for_steps": None, "duration": None}

    def serving_windows(self, spec: FaultSpec, start_s: float) -> list[tuple[int, Window]]:
        """The target rank's instance computes and reads ``factor`` times as long for ``duration``."""
        p = {**self.params, **spec.params}
        duration = parse_duration(p["duration"]) if p["duration"] is not None else None
        end = start_s + duration if duration is not None else float("inf")
        return [(int(spec.target["rank"]), Window(start_s, end, "straggler", factor=float(p["factor"])))]

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A rank target (:mod:`faults.targets`), a step inside the run, a factor of at least 1."""
        problems = target_problems(spec, facts, self.name)
        step = spec.at.get("step")
        if set(spec.at) != {"step"} or not isinstance(step, int) or not 1 <= step <= facts.steps:
            problems.append((("at",), f"straggler needs 'at: {{step: N}}' with N in 1..{facts.steps}"))
        factor = spec.params.get("factor", self.params["factor"])
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            problems.append(
                (("factor",), f"factor must be a number of at least 1 (2: twice as slow), got {factor!r}")
            )
        return problems + span_problems(spec)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The ranks, the factor and the span."""
        ranks = resolve_ranks(spec, seed, facts)
        p = {**self.params, **spec.params}
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=ranks[0] if len(ranks) == 1 else -1,
            step=int(spec.at["step"]),
            point="boundary",
            params={"ranks": ranks, "factor": float(p["factor"]), "for_steps": p["for_steps"]},
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Slow the ranks down from this step; say when they recover."""
        p = fault.params
        injector.set_knob(p["ranks"], "slowdown", p["factor"])
        heal = heal_step(fault)
        return {"factor": p["factor"], "heal_step": heal}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Back to full speed."""
        injector.set_knob(fault.params["ranks"], "slowdown", 1.0)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """The rank slowed 1.5 to 4 times for 1 to 4 steps."""
        step = draw(st.integers(1, facts.steps))
        span = draw(st.integers(1, 4))
        factor = draw(st.sampled_from([1.5, 2.0, 4.0]))
        return {**on_rank(self.name, rank, step), "factor": factor, "for_steps": span}

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The steps the slowed ranks ran while it was in force."""
        return slowed(fired, evidence, f"compute x{fired.get('params', {}).get('factor', 1):g} on")


#: ``at.during`` values of ``hang`` and the point in the step each one names.
HANG_POINTS = {
    "boundary": "step.start",
    "forward": "forward",
    "backward": "backward",
    "allreduce": "allreduce.mid",
}


@register
class Hang(FaultKind):
    """Freeze an NPU's process (SIGSTOP): it lives, and answers nothing."""

    name = "hang"
    ends_process = True
    real_failure = True
    drill_order = 4
    description = (
        "freeze an NPU process with SIGSTOP at a step boundary, in the forward or backward pass or "
        "mid-allreduce; only timeouts find it"
    )

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank (named or ``mode: one``), a step inside the run, a point."""
        return target_problems(spec, facts, self.name, single=True) + step_problems(
            spec, facts, self.name, HANG_POINTS
        )

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The rank (named or drawn), the step and the point."""
        step, point = point_of(spec, facts, HANG_POINTS)
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=single_rank(spec, seed, facts),
            step=step,
            point=point,
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Arm the rank to freeze itself at the point (a frozen process cannot be told anything)."""
        injector.arm_hang(fault.rank, fault.step, fault.point)
        return {"armed": fault.point, "action": "hang"}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A frozen process stays frozen: recovery kills and replaces it."""

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """The rank frozen at a step's boundary or mid-allreduce."""
        step = draw(st.integers(1, facts.steps))
        during = draw(st.sampled_from(["boundary", "allreduce"]))
        return {"kind": self.name, "target": {"rank": rank}, "at": {"step": step, "during": during}}

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Froze when the rank reached its point (the recovery then killed it, journalled as a hang)."""
        rank, step, point = (
            int(fired.get("rank", -1)),
            int(fired.get("step", 0)),
            str(fired.get("point", "boundary")),
        )
        where = f"{point_text(point)} of step {step}"
        if evidence.deaths([rank], step, "hang"):
            return Effect(True, f"froze rank {rank} at {where}")
        return Effect(False, f"rank {rank} never reached {where}{evidence.ended_early()}")
