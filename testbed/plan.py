"""The plan: every fault of a scenario resolved from its seed before anything starts."""

from __future__ import annotations

from testbed.collectives.select import choose, links_of
from testbed.faultkind import ClusterFacts, PlannedFault, kinds
from testbed.scenario import Scenario


def job_algorithm(scenario: Scenario) -> str:
    """The algorithm the job's gradient allreduce uses (``auto`` resolved from the model's size)."""
    from workloads import WORKLOADS

    algo = scenario.policy.collectives.algorithm
    if algo != "auto":
        return algo
    w = scenario.workload
    probe = WORKLOADS[w.name].factory(w.options, scenario.seed, 0, w.dp)
    nbytes = 4 * sum(v.size for v in probe.state("params").values())
    topo = scenario.cluster.topology()
    return choose("allreduce", list(range(topo.world)), topo, nbytes)


def facts_of(scenario: Scenario) -> ClusterFacts:
    """What fault planning knows about the run: size, steps, topology, the links the job uses."""
    topo = scenario.cluster.topology()
    members = list(range(topo.world))
    links = tuple(links_of(job_algorithm(scenario), members, topo))
    return ClusterFacts(world=topo.world, steps=scenario.workload.steps, topology=topo, job_links=links)


def make_plan(scenario: Scenario) -> list[PlannedFault]:
    """Every fault of the scenario resolved from its seed, ordered by step."""
    registry = kinds()
    facts = facts_of(scenario)
    planned = [registry[f.kind].plan(f, scenario.seed, facts) for f in scenario.faults]
    return sorted(planned, key=lambda f: (f.step, f.id))
