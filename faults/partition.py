"""A partition between supernodes: every link across the cut delivers nothing, one way or both,
until it heals.

``target: {supernodes: [i, ...]}`` names the side cut off (at least one
supernode, not all of them); the rest of the cluster is the other side.
``direction``: ``both`` (the default), ``into`` (nothing reaches the cut
side) or ``out_of`` (nothing leaves it). ``heal``: how long the cut lasts on
the virtual clock (absent: for good). As ``link_drop``'s windows do, the
cut starts at the step boundary where it is injected, or at a point of the
step (``during``) where each rank starts it at its own time.

A collective across the cut never completes: the ranks' exec timeouts fire,
and the recovery in force restarts the job; while the cut lasts, each new
attempt fails the same way, and once it heals steps advance again.

With ``cuts_control: true`` the cut severs the control network too: the
controller (which lives with rank 0) cannot reach the ranks on the other
side, so the failure declares them lost and their processes run on, cut off
and replaced: zombies. At the heal each one commits its own version of the
step it was in, which the storage must refuse
(``policy.checkpoint.fencing``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence
from faults.kind import ClusterFacts, DrawFacts, FaultSpec, Injector, PlannedFault, Problems, one_of, register
from faults.link import LINK_POINTS, LinkDrop, _check_durations, _check_step, _until
from testbed.fabric.linkfaults import LinkFault

#: the directions of a partition, and what each one cuts
DIRECTIONS = {
    "both": "nothing crosses the cut",
    "into": "nothing reaches the cut side",
    "out_of": "nothing leaves the cut side",
}


def fired(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partitions a journal says fired (their ``fault_injected`` events)."""
    return [e for e in events if e.get("event") == "fault_injected" and e.get("kind") == Partition.name]


def cut_side(spec: FaultSpec) -> list[int]:
    """The supernodes a partition entry cuts off."""
    return [int(s) for s in spec.target.get("supernodes", [])]


@register
class Partition(LinkDrop):
    """Some supernodes lose every link to the rest: both ways or one way, until ``heal``."""

    name = "partition"
    description = "the links between some supernodes and the rest deliver nothing until it heals"
    points = tuple(LINK_POINTS)
    params: ClassVar[dict[str, Any]] = {"heal": None, "direction": "both", "cuts_control": False}
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "heal": ("seconds", "how long the partition lasts on the virtual clock (absent: for good)"),
        "direction": ("both|into|out_of", "into: nothing reaches the cut side; out_of: nothing leaves it"),
        "cuts_control": ("boolean", "the controller cannot reach the side away from rank 0 either"),
    }
    durations = ("heal",)
    drill_order = 11

    def drawable(self, facts: DrawFacts) -> bool:
        """A partition needs two supernodes."""
        return super().drawable(facts) and facts.supernodes >= 2

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """One supernode cut off at a boundary, one way or both, cutting the controller off or not,
        healing within 1 to 10 s: before a restart links again, on a base that detects and restarts
        in more than that (a longer cut fails re-links, each one a restart of the base's budget)."""
        return {
            "kind": self.name,
            "target": {"supernodes": [draw(st.integers(0, facts.supernodes - 1))]},
            "at": {"step": draw(st.integers(1, max(1, facts.steps - 1)))},
            "heal": f"{draw(st.integers(1, 10))}s",
            "direction": draw(st.sampled_from(sorted(DIRECTIONS))),
            "cuts_control": draw(st.booleans()),
        }

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """Trigger, heal, direction, and a cut side of at least one supernode and not all."""
        problems: Problems = []
        _check_step(spec, facts, problems, self.points)
        _check_durations(spec, self.durations, problems)
        heal = spec.params.get("heal")
        if isinstance(heal, (int, float)) and not isinstance(heal, bool) and heal <= 0:
            problems.append((("heal",), f"heal must be above 0 s, got {heal!r}; leave it out for good"))
        if not isinstance(spec.params.get("cuts_control", False), bool):
            problems.append((("cuts_control",), "cuts_control is true or false"))
        direction = spec.params.get("direction", "both")
        if not one_of(direction, DIRECTIONS):
            problems.append((("direction",), f"direction must be both, into or out_of, got {direction!r}"))
        nodes = int(facts.topology.supernodes) if facts.topology is not None else 1
        named = spec.target.get("supernodes")
        ok = isinstance(named, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in named)
        if set(spec.target) != {"supernodes"} or not ok or not named:
            problems.append(
                (
                    ("target",),
                    "a partition cuts some supernodes off from the rest: give at least one, like "
                    f"'target: {{supernodes: [1]}}' (supernodes 0..{nodes - 1}); got {spec.target!r}",
                )
            )
        elif not all(0 <= s < nodes for s in named) or len(set(named)) != len(named):
            problems.append(
                (("target", "supernodes"), f"supernodes must be distinct, in 0..{nodes - 1}; got {named!r}")
            )
        elif len(set(named)) == nodes:
            problems.append(
                (
                    ("target", "supernodes"),
                    f"{named!r} names every supernode: nothing is left on the other side; name fewer",
                )
            )
        return problems

    def links(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> list[tuple[int, int]]:
        """The directed links across the cut that ``direction`` cuts."""
        topo, cut = facts.topology, set(cut_side(spec))
        inside = [r for r in range(facts.world) if topo.supernode_of(r) in cut]
        outside = [r for r in range(facts.world) if topo.supernode_of(r) not in cut]
        direction = spec.params.get("direction", "both")
        pairs = []
        if direction in ("both", "into"):
            pairs += [(a, b) for a in outside for b in inside]
        if direction in ("both", "out_of"):
            pairs += [(a, b) for a in inside for b in outside]
        return sorted(pairs)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The links across the cut, the supernodes cut off, and the ranks on the side away from the
        controller (rank 0's)."""
        planned = super().plan(spec, seed, facts)
        cut, topo = set(cut_side(spec)), facts.topology
        inside = topo.supernode_of(0) in cut
        away = [r for r in range(facts.world) if (topo.supernode_of(r) in cut) != inside]
        return dataclasses.replace(planned, params={**planned.params, "cut": sorted(cut), "away": away})

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """The cut's link records; with ``cuts_control``, the controller loses the side away from it."""
        record = super().inject(injector, fault)
        if fault.params.get("cuts_control"):
            t0 = record["t0"] if record.get("t0") is not None else injector.now()
            injector.cut_control(fault.id, list(fault.params["away"]), float(t0))
        return record

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """The links carry again; the controller reaches the side it lost, and hears from its zombies."""
        super().heal(injector, fault)
        if fault.params.get("cuts_control"):
            injector.zombies_return(fault.id)

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The messages it dropped; with ``cuts_control``, what became of the processes given up."""
        base = super().effect(fired, evidence)
        mine = fired.get("id")
        writes = [e for e in evidence.events if e.get("event") == "zombie_write" and e.get("fault") == mine]
        if not writes:
            return base
        landed = sum(1 for w in writes if w.get("landed"))
        ranks = ",".join(str(w["rank"]) for w in writes)
        said = f"{landed} landed" if landed else "all refused"
        return Effect(base.took, f"{base.how}; ranks {ranks} given up, their late commits: {said}")

    def records(self, fault: Any, t0: float) -> list[LinkFault]:
        """One drop window per directed link across the cut, until it heals."""
        t1 = _until(t0, fault.params["heal"])
        return [LinkFault(fault.id, "drop", a, b, t0, t1) for a, b in fault.params["links"]]
