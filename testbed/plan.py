"""The plan: every fault of a scenario resolved from its seed before anything starts."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from testbed.collectives.select import choose, links_of
from testbed.faultkind import ClusterFacts, PlannedFault, kinds
from testbed.scenario import Scenario
from testbed.triggers import plan_all


def job_algorithm(scenario: Scenario) -> str:
    """The algorithm the job's gradient allreduce uses (``auto`` resolved from the model's size)."""
    from workloads import WORKLOADS

    algo = scenario.policy.collectives.algorithm
    if algo != "auto":
        return algo
    w = scenario.workload
    probe = WORKLOADS[w.name].factory(w.options, scenario.seed, 0, w.layout())
    nbytes = max(probe.sync_plan().values())
    topo = scenario.cluster.topology()
    return choose("allreduce", w.layout().group(0, ("dp", "ep")), topo, nbytes)


def job_links(scenario: Scenario) -> list[tuple[int, int]]:
    """The directed links the job sends on: its gradient allreduce's, and its TP, EP and PP groups'."""
    topo, layout = scenario.cluster.topology(), scenario.workload.layout()
    algo = job_algorithm(scenario)
    links: set[tuple[int, int]] = set()
    for rank in range(topo.world):
        links.update(links_of(algo, layout.group(rank, ("dp", "ep")), topo))
        for axis in ("tp", "ep"):
            links.update(links_of("mesh", layout.group(rank, (axis,)), topo))
        stages = layout.group(rank, ("pp",))
        links.update(itertools.pairwise(stages))
        links.update((b, a) for a, b in itertools.pairwise(stages))
    return sorted(links)


def facts_of(scenario: Scenario) -> ClusterFacts:
    """What fault planning knows about the run: size, steps, topology, the links the job uses."""
    topo = scenario.cluster.topology()
    links = tuple(job_links(scenario))
    return ClusterFacts(
        world=topo.world,
        steps=scenario.workload.steps,
        topology=topo,
        job_links=links,
        checkpoint_every=scenario.policy.checkpoint.every,
    )


def make_plan(scenario: Scenario) -> list[PlannedFault]:
    """Every fault of the scenario resolved from its seed, ordered by step."""
    registry = kinds()
    facts = facts_of(scenario)
    planned = [p for f in scenario.faults for p in plan_all(registry[f.kind], f, scenario.seed, facts)]
    return sorted(planned, key=lambda f: (f.step, f.id))


def plan_digest(faults: list[dict[str, Any]]) -> str:
    """sha256 of the resolved faults (what ``testbed plan`` shows and a run journals)."""
    return hashlib.sha256(json.dumps(faults, sort_keys=True, default=str).encode()).hexdigest()


#: Arrivals of a Poisson fault shown in a plan (the process goes on past them).
PLAN_ARRIVALS = 10


def resolved_plan(scenario: Scenario) -> dict[str, Any]:
    """What ``testbed plan`` writes: the scenario's identity and every fault resolved from its seed;
    for a Poisson fault, its first arrivals (times and targets, drawn as a run would draw them)."""
    from testbed.arrivals import Arrivals

    faults = []
    planned = make_plan(scenario)
    for fault in planned:
        entry = fault.as_dict()
        if "mtbf" in fault.params:
            process = Arrivals.start(fault, scenario.seed)
            drawn: list[Any] = []
            while len(drawn) < PLAN_ARRIVALS:
                drawn.extend(process.due(process.next_t, 0))
            entry["arrivals"] = [
                {"t": f.params["t_arrival"], "ranks": f.params["ranks"]} for f in drawn[:PLAN_ARRIVALS]
            ]
        faults.append(entry)
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "scenario_sha256": scenario.digest(),
        "plan_sha256": plan_digest([f.as_dict() for f in planned]),
        "steps": scenario.workload.steps,
        "faults": faults,
    }
