"""Node faults: NPU processes die.

``node_kill`` sends a real SIGKILL to the target NPU actors' processes,
through the supervising actor of their supernode (the node agent), either at
a step boundary (before the step starts) or in the middle of that step's
first allreduce (after the rank has sent its first chunks). The target is a
rank, a whole supernode (every NPU of it at once: a supernode lost), or
``mode: random`` (a rank drawn from the scenario's seed). With ``at: {mtbf:
DURATION}`` instead of a step, kills come as a Poisson process in virtual
time (:mod:`testbed.arrivals`): a random target is drawn at each arrival.
With ``scope: ray_node`` (a supernode target, at a boundary) the supernode's
whole Ray node is lost: its raylet is SIGKILLed, and every process on it
dies with it (only on a multi-node Ray cluster, where each supernode has a
node of its own).
"""

from __future__ import annotations

from typing import Any, ClassVar

from testbed.faultkind import (
    ClusterFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    heal_step,
    known_point,
    one_rank_problems,
    register,
    span_problems,
)
from testbed.units import parse_duration

#: ``at.during`` values and the point in the step each one names.
POINTS = {"boundary": "boundary", "allreduce": "allreduce.mid"}


def _mtbf_problems(spec: FaultSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """``at: {mtbf: DURATION}``: a positive duration, and nothing else in the trigger."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    mtbf = parse_duration(spec.at["mtbf"])
    if mtbf is None or mtbf <= 0:
        problems.append(
            (("at", "mtbf"), f"mtbf must be a positive duration like 3600 or '1h', got {spec.at['mtbf']!r}")
        )
    extra = sorted(set(spec.at) - {"mtbf"})
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
    description = (
        "SIGKILL NPU processes (a rank, a whole supernode, or a random rank), at a boundary or mid-allreduce"
    )
    #: ``scope: ray_node`` takes a supernode's whole Ray node down (multi-node Ray clusters only)
    params: ClassVar[dict[str, Any]] = {"scope": "process"}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> list[tuple[tuple[str | int, ...], str]]:
        """The target is a rank, a supernode or ``mode: random``; the step is inside the run."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        t = spec.target
        usage = "node_kill takes 'target: {rank: N}', '{supernode: N}' or '{mode: random}'"
        if len(t) != 1 or not ({"rank", "supernode"} & set(t) or t.get("mode") == "random"):
            problems.append((("target",), usage))
        elif "rank" in t:
            rank = t["rank"]
            if not isinstance(rank, int) or isinstance(rank, bool):
                problems.append((("target",), "node_kill needs 'target: {rank: N}' with an integer rank"))
            elif not 0 <= rank < facts.world:
                problems.append(
                    (
                        ("target", "rank"),
                        f"rank {rank} is outside the cluster: ranks are 0..{facts.world - 1}; "
                        "pick one of those",
                    )
                )
        elif "supernode" in t:
            nodes = facts.topology.supernodes if facts.topology is not None else 1
            sn = t["supernode"]
            if not isinstance(sn, int) or isinstance(sn, bool) or not 0 <= sn < nodes:
                problems.append((("target", "supernode"), f"supernode must be in 0..{nodes - 1}, got {sn!r}"))
        scope = spec.params.get("scope", "process")
        if scope not in ("process", "ray_node"):
            problems.append((("scope",), f"scope must be process or ray_node, got {scope!r}"))
        elif scope == "ray_node" and (
            "supernode" not in t or spec.at.get("during", "boundary") != "boundary"
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
        step = spec.at.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            problems.append(
                (("at",), "node_kill needs 'at: {step: N}' with an integer step, or 'at: {mtbf: DURATION}'")
            )
        elif not 1 <= step <= facts.steps:
            problems.append(
                (
                    ("at", "step"),
                    f"step {step} is outside the run: steps are 1..{facts.steps}; pick one of those",
                )
            )
        during = spec.at.get("during", "boundary")
        if not known_point(during, POINTS):
            problems.append(
                (
                    ("at", "during"),
                    f"'during: {during}' is not a point node_kill knows; use one of {', '.join(POINTS)}",
                )
            )
        extra_at = sorted(set(spec.at) - {"step", "during"})
        if extra_at:
            problems.append(
                (("at", extra_at[0]), f"unknown trigger field '{extra_at[0]}'; use step and during, or mtbf")
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The ranks to kill: the one named, the supernode's, or one drawn from the seed.

        With ``at.mtbf`` the fault is a Poisson process (:mod:`testbed.arrivals`):
        step 0 and ``params.mtbf``; a random target is drawn anew at each arrival.
        """
        t = spec.target
        if "mtbf" in spec.at:
            fixed = [int(t["rank"])] if "rank" in t else []
            if "supernode" in t:
                fixed = list(facts.topology.ranks_of(int(t["supernode"])))
            return PlannedFault(
                id=f"f{spec.index}-{self.name}",
                kind=self.name,
                rank=-1,
                step=0,
                point="boundary",
                params={"ranks": fixed, "mtbf": parse_duration(spec.at["mtbf"]), "world": facts.world},
            )
        if "rank" in t:
            ranks = [int(t["rank"])]
        elif "supernode" in t:
            ranks = list(facts.topology.ranks_of(int(t["supernode"])))
        else:
            ranks = [int(spec.stream(seed, "node_kill").integers(facts.world))]
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=ranks[0] if len(ranks) == 1 else -1,
            step=int(spec.at["step"]),
            point=POINTS[spec.at.get("during", "boundary")],
            params={"ranks": ranks, **({"supernode": int(t["supernode"])} if "supernode" in t else {})}
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


@register
class Straggler(FaultKind):
    """Slow an NPU's compute by a factor (thermal throttling, a degraded chip)."""

    name = "straggler"
    description = "multiply the compute time of a rank (or a supernode's) by 'factor' for 'for_steps' steps"
    params: ClassVar[dict[str, Any]] = {"factor": 2.0, "for_steps": None}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> list[tuple[tuple[str | int, ...], str]]:
        """A rank or supernode, a step inside the run, a factor of at least 1."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        t = spec.target
        nodes = facts.topology.supernodes if facts.topology is not None else 1
        if set(t) == {"rank"}:
            if (
                not isinstance(t["rank"], int)
                or isinstance(t["rank"], bool)
                or not 0 <= t["rank"] < facts.world
            ):
                problems.append(
                    (("target", "rank"), f"rank must be in 0..{facts.world - 1}, got {t['rank']!r}")
                )
        elif set(t) == {"supernode"}:
            if not isinstance(t["supernode"], int) or not 0 <= t["supernode"] < nodes:
                problems.append((("target", "supernode"), f"supernode must be in 0..{nodes - 1}"))
        else:
            problems.append((("target",), "straggler takes 'target: {rank: N}' or '{supernode: N}'"))
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
        t = spec.target
        ranks = [int(t["rank"])] if "rank" in t else list(facts.topology.ranks_of(int(t["supernode"])))
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
        injector.slow_down(p["ranks"], p["factor"])
        heal = heal_step(fault)
        return {"factor": p["factor"], "heal_step": heal}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Back to full speed."""
        injector.slow_down(fault.params["ranks"], 1.0)


#: ``at.during`` values of ``hang`` and the point in the step each one names.
HANG_POINTS = {"boundary": "step.start", "allreduce": "allreduce.mid"}


@register
class Hang(FaultKind):
    """Freeze an NPU's process (SIGSTOP): it lives, and answers nothing."""

    name = "hang"
    description = (
        "freeze an NPU process with SIGSTOP at a step boundary or mid-allreduce; only timeouts find it"
    )

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> list[tuple[tuple[str | int, ...], str]]:
        """One rank, a step inside the run, a point."""
        problems = one_rank_problems(spec, facts, self.name)
        step = spec.at.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= facts.steps:
            problems.append((("at", "step"), f"hang needs 'at: {{step: N}}' with N in 1..{facts.steps}"))
        during = spec.at.get("during", "boundary")
        if not known_point(during, HANG_POINTS) or set(spec.at) - {"step", "during"}:
            problems.append((("at", "during"), f"hang takes 'during: {' or '.join(HANG_POINTS)}'"))
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """A fixed rank, step and point."""
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=int(spec.target["rank"]),
            step=int(spec.at["step"]),
            point=HANG_POINTS[spec.at.get("during", "boundary")],
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Arm the rank to freeze itself at the point (a frozen process cannot be told anything)."""
        injector.arm_hang(fault.rank, fault.step, fault.point)
        return {"armed": fault.point, "action": "hang"}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A frozen process stays frozen: recovery kills and replaces it."""
