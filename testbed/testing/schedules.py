"""Hypothesis strategies for users' own property tests: clusters, layouts, policies, faults and
whole fault schedules, each producing scenario pieces the validator accepts.

Everything here is plain data (the YAML form of a scenario), so a drawn example
prints as the scenario a user would write, and :func:`scenarios` turns it into a
validated :class:`~testbed.scenario.model.Scenario`::

    from hypothesis import given
    from testbed.testing.schedules import scenarios

    @given(scenarios(base="scenarios/drill_base.yaml", max_faults=2))
    def test_every_schedule_recovers(scenario, testbed_run):
        assert testbed_run(scenario).verdict == "pass"

A fault schedule is sorted by step, holds at most one process-ending fault
(``node_kill`` or ``hang``) per step and never two faults on one rank in one
step, and no fault reaches more ranks than the scenario's blast-radius cap.
Hypothesis shrinks a schedule towards fewer faults, earlier steps and the
plainest kinds and targets.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from faults.kind import DrawFacts
from faults.kind import kinds as fault_kinds
from testbed.core.errors import ScenarioError
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.topology.presets import PRESETS


def drill_kinds() -> tuple[str, ...]:
    """The kinds a schedule draws from, plainest first (Hypothesis shrinks towards the front): those
    whose trait :attr:`~faults.kind.FaultKind.drill_order` places them among the drills' kinds."""
    drawn = [k for k in fault_kinds().values() if k.drill_order is not None]
    return tuple(k.name for k in sorted(drawn, key=lambda k: k.drill_order or 0))


#: the kinds drills draw from, in their order
SCHEDULE_KINDS = drill_kinds()


def topologies(
    max_supernodes: int = 2, npus: tuple[int, ...] = (1, 2, 4)
) -> st.SearchStrategy[dict[str, Any]]:
    """A ``cluster`` section: a preset, 1..``max_supernodes`` supernodes of one of ``npus`` NPUs
    (powers of two by default, which every workload's batch and sizes divide)."""
    return st.fixed_dictionaries(
        {
            "preset": st.sampled_from(sorted(PRESETS)),
            "supernodes": st.integers(1, max_supernodes),
            "npus_per_supernode": st.sampled_from(npus),
        }
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def layouts(
    draw: st.DrawFn,
    world: int,
    axes: tuple[str, ...] = ("dp", "tp", "pp"),
    degrees: tuple[int, ...] = (1, 2, 4),
) -> dict[str, int]:
    """A ``workload.parallel`` section whose degrees multiply to ``world``: every axis but the first
    takes one of ``degrees`` that divides what is left, the first takes the rest. The defaults fit
    the default transformer (sizes in powers of two, 4 layers: pp at most 4); the MLP trains
    data-parallel only: pass ``axes=("dp",)``."""
    out, left = {}, world
    for axis in axes[1:]:
        out[axis] = draw(st.sampled_from([d for d in _divisors(left) if d in degrees]))
        left //= out[axis]
    return {axes[0]: left, **out}


def policies(steps: int = 12) -> st.SearchStrategy[dict[str, Any]]:
    """A ``policy`` section: checkpoint interval and contents, recovery strategy, timeouts."""
    components = ["params", "optimizer", "lr_scheduler", "rng", "data_cursor"]
    return st.fixed_dictionaries(
        {
            "checkpoint": st.fixed_dictionaries(
                {
                    "every": st.integers(1, max(1, steps // 2)),
                    "include": st.just(components),
                }
            ),
            "recovery": st.fixed_dictionaries(
                {
                    "strategy": st.sampled_from(["restart", "hot_spare"]),
                    "restart_s": st.integers(0, 60),
                    "max_restarts": st.just(5),
                }
            ),
            "timeouts": st.fixed_dictionaries({"exec_s": st.sampled_from([300, 600, 1836])}),
        }
    )


def draw_facts(scenario: Scenario) -> DrawFacts:
    """What drawing a fault entry for ``scenario`` needs to know of it."""
    topo = scenario.cluster.topology()
    steps, every = scenario.workload.steps, scenario.policy.checkpoint.every
    return DrawFacts(
        world=topo.world,
        steps=steps,
        checkpoints=tuple(range(every, steps, every)) if every else (),
        corruptible=tuple(
            c for c in ("params", "optimizer", "rng") if c in scenario.policy.checkpoint.include
        ),
        one_rank_fits=scenario.safeguards.blast_radius_percent * topo.world >= 100,
        integrity=scenario.policy.integrity is not None,
        supernodes=topo.supernodes,
    )


def usable_kinds(scenario: Scenario, kinds: tuple[str, ...] = SCHEDULE_KINDS) -> list[str]:
    """The ``kinds`` a fault entry of ``scenario`` can be (each kind says: a checkpoint kind needs a
    checkpoint before the last step, a kind of several ranks a cluster where one rank is within the
    blast-radius cap, ...)."""
    facts, registry = draw_facts(scenario), fault_kinds()
    return [k for k in kinds if registry[k].drawable(facts)]


@st.composite
def faults(draw: st.DrawFn, scenario: Scenario, kinds: tuple[str, ...] = SCHEDULE_KINDS) -> dict[str, Any]:
    """One fault entry that is valid in ``scenario`` (its cluster, steps, checkpoints and blast-radius
    cap); ``kinds`` must hold one of :func:`usable_kinds`. Each kind draws its own fields."""
    facts = draw_facts(scenario)
    kind = draw(st.sampled_from(usable_kinds(scenario, kinds)))
    rank = draw(st.integers(0, facts.world - 1))
    return fault_kinds()[kind].draw(draw, facts, rank)


def _rank_of(entry: dict[str, Any]) -> int | None:
    return entry.get("target", {}).get("rank")


def can_coexist(schedule: list[dict[str, Any]]) -> bool:
    """At most one process-ending fault per step, and never two faults on one rank in one step."""
    seen_fatal: set[int] = set()
    seen_rank: set[tuple[int, int]] = set()
    registry = fault_kinds()
    for f in schedule:
        step, rank = f["at"]["step"], _rank_of(f)
        if registry[f["kind"]].ends_process:
            if step in seen_fatal:
                return False
            seen_fatal.add(step)
        if rank is not None:
            if (step, rank) in seen_rank:
                return False
            seen_rank.add((step, rank))
    return True


def fault_schedules(
    scenario: Scenario, max_faults: int = 3, kinds: tuple[str, ...] = SCHEDULE_KINDS
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A list of 0..``max_faults`` fault entries valid in ``scenario``, sorted by step, that can
    coexist (see the module's docstring); only empty lists when no kind is usable there."""
    if not usable_kinds(scenario, kinds):
        return st.just([])
    return (
        st.lists(faults(scenario, kinds), max_size=max_faults)
        .map(lambda fs: sorted(fs, key=lambda f: (f["at"]["step"], SCHEDULE_KINDS.index(f["kind"]))))
        .filter(can_coexist)
    )


def with_faults(scenario: Scenario, schedule: list[dict[str, Any]], name: str | None = None) -> Scenario:
    """``scenario`` with its faults replaced by ``schedule`` (validated like a file)."""
    return parse_scenario(scenario_yaml(scenario, schedule, name), scenario.file or "<drawn>")


def scenario_yaml(scenario: Scenario, schedule: list[dict[str, Any]], name: str | None = None) -> str:
    """The YAML text of ``scenario`` with ``schedule`` as its faults: a plain scenario file."""
    source = Path(scenario.file) if scenario.file else None
    if source is None or not source.is_file():
        raise ScenarioError(
            f"scenario {scenario.name!r} has no file to start from ({scenario.file or 'none'}); "
            "load the base with load_scenario(PATH)"
        )
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    doc = copy.deepcopy(raw) if isinstance(raw, dict) else {}
    doc["faults"] = schedule
    doc["seed"] = scenario.seed
    if name is not None:
        doc["name"] = name
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def scenarios(
    base: str | Path | Scenario, max_faults: int = 3, kinds: tuple[str, ...] = SCHEDULE_KINDS
) -> st.SearchStrategy[Scenario]:
    """Validated scenarios: ``base`` (a file or a loaded scenario) with a drawn fault schedule."""
    loaded = base if isinstance(base, Scenario) else load_scenario(base)
    return fault_schedules(loaded, max_faults, kinds).map(lambda s: with_faults(loaded, s))
