"""The plan: every fault of a scenario resolved from its seed before anything starts."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from faults.kind import ClusterFacts, PlannedFault, kinds
from faults.triggers import plan_all
from testbed.collectives.select import choose, links_of
from testbed.scenario.model import Scenario
from testbed.scenario.preemption_ladder import preemption_warnings


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


def job_links(scenario: Scenario, ranks: list[int] | None = None) -> list[tuple[int, int]]:
    """The directed links the job sends on: its gradient allreduce's, its TP, EP and PP groups', and
    (when it checkpoints) the world barrier before each checkpoint; with ``ranks``, only those of the
    groups those ranks are in. Each distinct group counts once."""
    topo, layout = scenario.cluster.topology(), scenario.workload.layout()
    algo = job_algorithm(scenario)
    groups: set[tuple[str, tuple[int, ...]]] = set()
    for rank in range(topo.world) if ranks is None else ranks:
        groups.add((algo, tuple(layout.group(rank, ("dp", "ep")))))
        groups.update(("mesh", tuple(layout.group(rank, (axis,)))) for axis in ("tp", "ep"))
        groups.add(("pp", tuple(layout.group(rank, ("pp",)))))
    if scenario.policy.checkpoint.every:
        world = list(range(topo.world))
        groups.add((choose("barrier", world, topo, 8), tuple(world)))
    links: set[tuple[int, int]] = set()
    for how, members in groups:
        if how == "pp":
            links.update(itertools.pairwise(members))
            links.update((b, a) for a, b in itertools.pairwise(members))
        else:
            links.update(links_of(how, list(members), topo))
    return sorted(links)


def unused_link_warnings(scenario: Scenario) -> list[str]:
    """A warning for each link fault on fixed links (``{link: [a, b]}``) the job never sends on: it
    would run and change nothing. Each names the links the job does use at those ranks."""
    registry = kinds()
    entries = [
        f
        for f in scenario.faults
        if f.kind in registry and registry[f.kind].acts_on_links and "link" in f.target
    ]
    if not entries:
        return []
    out = []
    for f in entries:
        a, b = (int(x) for x in f.target["link"])
        used = set(job_links(scenario, [a, b]))
        pairs = [(a, b)] if f.params.get("direction", "both") == "one" else [(a, b), (b, a)]
        if any(p in used for p in pairs):
            continue
        near = sorted(link for link in used if {a, b} & set(link))
        shown = ", ".join(f"{x}->{y}" for x, y in near[:8]) + (
            f" and {len(near) - 8} more" if len(near) > 8 else ""
        )
        out.append(
            f"faults[{f.index}] {f.kind} on link {a}<->{b}: the job never sends on it (its allreduce runs "
            f"{job_algorithm(scenario)}), so the fault would change nothing; ranks {a} and {b} send on "
            f"{shown or 'no link'}: pick one of those"
        )
    return out


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


def plan_digest(scenario: Scenario, faults: list[dict[str, Any]]) -> str:
    """sha256 of the whole scenario (its content and seed, :meth:`Scenario.digest`) and its resolved
    faults: what ``testbed plan`` shows and a run journals, so that a dry run and its run agree, and
    two scenarios that differ anywhere differ here."""
    body = {"scenario": scenario.digest(), "faults": faults}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


#: Arrivals of a Poisson fault shown in a plan (the process goes on past them).
PLAN_ARRIVALS = 10


def resolved_plan(scenario: Scenario) -> dict[str, Any]:
    """What ``testbed plan`` writes: the scenario's identity and every fault resolved from its seed;
    for a Poisson fault, its first arrivals (times and targets, drawn as a run would draw them)."""
    from faults.arrivals import Arrivals

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
        "plan_sha256": plan_digest(scenario, [f.as_dict() for f in planned]),
        "steps": scenario.workload.steps,
        "faults": faults,
    }


def _first_collective(
    scenario: Scenario, a: int, b: int, compute_s: float, micro_batches: int
) -> tuple[float, str]:
    """When, after a step begins, the job first sends between ranks ``a`` and ``b``, and what: at once
    in a TP or EP group (the forward pass's first layer), after a micro-batch's forward on a pipeline
    link, after the whole forward and backward for the gradient allreduce alone."""
    layout = scenario.workload.layout()
    if b in layout.group(a, ("tp",)) or b in layout.group(a, ("ep",)):
        return 0.0, "a TP or EP collective in the forward pass"
    if b in layout.group(a, ("pp",)):
        return compute_s / (3 * max(1, micro_batches)), "the first pipeline send (a micro-batch's forward)"
    return compute_s, "the gradient allreduce, after the forward and backward passes"


def missed_window_warnings(scenario: Scenario) -> list[str]:
    """A warning for each link fault at a step boundary whose window ends, by the job's own step
    figures, before any collective on its links begins: it would change nothing. Each says what
    would meet it: ``during`` that collective, or a longer window. Only a scenario with a ``job``
    section has step figures to judge by."""
    from testbed.scenario.job_estimate import scenario_estimate

    registry = kinds()
    entries = [
        f
        for f in scenario.faults
        if f.kind in registry
        and len(getattr(registry[f.kind], "points", ())) > 1
        and f.at.get("during", "boundary") == "boundary"
        and isinstance(f.at.get("step"), int)
        and f.at["step"] >= 1
    ]
    estimate = scenario_estimate(scenario) if entries else None
    if estimate is None:
        return []
    facts, out = facts_of(scenario), []
    compute_s, micro = estimate.step.compute_s, estimate.job.micro_batches
    for f in entries:
        planned = registry[f.kind].plan(f, scenario.seed, facts)
        records = registry[f.kind].records(planned, 0.0)  # type: ignore[attr-defined]
        window = max((r.t1 for r in records), default=0.0)
        links = [tuple(link) for link in planned.params["links"]]
        if not links or window == float("inf"):
            continue
        first, what = min(_first_collective(scenario, a, b, compute_s, micro) for a, b in links)
        if window < first:
            a, b = links[0]
            out.append(
                f"faults[{f.index}] {f.kind} on link {a}<->{b} is in force for {window:.3g} s from the "
                f"boundary of step {f.at['step']}, but the job computes {first:.3g} s before its first "
                f"message on it ({what}): it ends before any message meets it. Add 'during: allreduce' "
                "(or forward, backward, tp, pp, ep) to start it there, or make it last longer"
            )
    return out


def plan_warnings(scenario: Scenario) -> list[str]:
    """Every warning planning finds: link faults on links the job never uses, or over before the job
    sends on them; a preemption ladder out of order."""
    return [
        *unused_link_warnings(scenario),
        *missed_window_warnings(scenario),
        *preemption_warnings(scenario),
    ]
