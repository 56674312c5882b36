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

from testbed.core.errors import ScenarioError
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.topology.presets import PRESETS

#: the kinds a schedule draws from, plainest first (Hypothesis shrinks towards the front)
SCHEDULE_KINDS = ("node_kill", "straggler", "data_stall", "checkpoint_pause", "hang", "storage_corrupt")
#: kinds that act on a checkpoint (drawn at a checkpoint step before the last step)
AT_CHECKPOINT = ("checkpoint_pause", "storage_corrupt")
#: kinds that end a process (at most one such fault per step)
FATAL = ("node_kill", "hang")


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


def _facts(scenario: Scenario) -> tuple[int, int, int, int]:
    topo = scenario.cluster.topology()
    return topo.world, scenario.workload.steps, scenario.policy.checkpoint.every, topo.supernodes


#: kinds held to the blast-radius cap (they may name several ranks)
CAPPED = ("node_kill", "straggler", "data_stall")


def _corruptible(scenario: Scenario) -> list[str]:
    """The saved components a ``storage_corrupt`` may target."""
    return [c for c in ("params", "optimizer", "rng") if c in scenario.policy.checkpoint.include]


def usable_kinds(scenario: Scenario, kinds: tuple[str, ...] = SCHEDULE_KINDS) -> list[str]:
    """The ``kinds`` a fault entry of ``scenario`` can be: a checkpoint kind needs a checkpoint
    before the last step (and ``storage_corrupt`` a component to corrupt), a capped kind a cluster
    where one rank is within the blast-radius cap."""
    world, steps, every, _ = _facts(scenario)
    saved = _corruptible(scenario)
    one_rank_fits = scenario.safeguards.blast_radius_percent * world >= 100
    return [
        k
        for k in kinds
        if (k not in AT_CHECKPOINT or (every and every < steps and (k != "storage_corrupt" or saved)))
        and (k not in CAPPED or one_rank_fits)
    ]


@st.composite
def faults(draw: st.DrawFn, scenario: Scenario, kinds: tuple[str, ...] = SCHEDULE_KINDS) -> dict[str, Any]:
    """One fault entry that is valid in ``scenario`` (its cluster, steps, checkpoints and blast-radius
    cap); ``kinds`` must hold one of :func:`usable_kinds`."""
    world, steps, every, _ = _facts(scenario)
    saved = _corruptible(scenario)
    checkpoints = list(range(every, steps, every)) if every else []  # those before the last step
    kind = draw(st.sampled_from(usable_kinds(scenario, kinds)))
    rank = draw(st.integers(0, world - 1))
    if kind in AT_CHECKPOINT:
        step = draw(st.sampled_from(checkpoints))
        if kind == "checkpoint_pause":
            return {**_on(kind, rank, step), "pause": draw(st.sampled_from(["30s", "120s", "600s"]))}
        return {**_on(kind, rank, step), "component": draw(st.sampled_from(saved))}
    step = draw(st.integers(1, steps))
    if kind == "node_kill":
        target = draw(st.sampled_from([{"rank": rank}, {"mode": "one"}]))
        during = draw(st.sampled_from(["boundary", "allreduce", "forward", "backward"]))
        return {"kind": kind, "target": target, "at": {"step": step, "during": during}}
    if kind == "hang":
        during = draw(st.sampled_from(["boundary", "allreduce"]))
        return {"kind": kind, "target": {"rank": rank}, "at": {"step": step, "during": during}}
    span = draw(st.integers(1, 4))
    if kind == "straggler":
        factor = draw(st.sampled_from([1.5, 2.0, 4.0]))
        return {**_on(kind, rank, step), "factor": factor, "for_steps": span}
    delay = draw(st.sampled_from(["100ms", "1s", "5s"]))
    return {**_on(kind, rank, step), "delay": delay, "for_steps": span}


def _on(kind: str, rank: int, step: int) -> dict[str, Any]:
    return {"kind": kind, "target": {"rank": rank}, "at": {"step": step}}


def _rank_of(entry: dict[str, Any]) -> int | None:
    return entry["target"].get("rank")


def can_coexist(schedule: list[dict[str, Any]]) -> bool:
    """At most one process-ending fault per step, and never two faults on one rank in one step."""
    seen_fatal: set[int] = set()
    seen_rank: set[tuple[int, int]] = set()
    for f in schedule:
        step, rank = f["at"]["step"], _rank_of(f)
        if f["kind"] in FATAL:
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
