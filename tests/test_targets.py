"""Fault targets by selection mode, the blast-radius cap, and the shared triggers (every, time, phases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults.kind import PlannedFault
from faults.targets import draw_ranks
from faults.triggers import due
from testbed.control.runner import run
from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.scenario.model import Scenario
from testbed.scenario.parse import parse_scenario
from testbed.scenario.plan import make_plan

BASE = """\
version: 1
name: t
seed: 7
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 4}
workload: {name: mlp, steps: 30, parallel: {dp: 8}, hidden: 32}
policy: {checkpoint: {every: 5}}
SAFEGUARDS
faults:
  - kind: KIND
    target: TARGET
    at: AT
"""


def scenario(
    kind: str = "node_kill",
    target: str = "{rank: 1}",
    at: str = "{step: 4}",
    guard: str = "",
    base: str = BASE,
) -> Scenario:
    text = base.replace("KIND", kind).replace("TARGET", target).replace("AT", at)
    return parse_scenario(text.replace("SAFEGUARDS", guard), "t.yaml")


def problems(**kw: str) -> list[str]:
    with pytest.raises(ScenarioError) as err:
        scenario(**kw)
    return list(err.value.fields["problems"])


# --- selection modes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "count"),
    [
        ("{mode: one}", 1),
        ("{mode: random}", 1),
        ("{mode: fixed, value: 3}", 3),
        ("{mode: fixed-percent, value: 25}", 2),
        ("{mode: fixed-percent, value: 10}", 1),  # 0.8 of a rank rounds down, and a fault reaches one
        ("{mode: all, supernode: 1}", 4),
        ("{mode: fixed, value: 2, supernode: 0}", 2),
    ],
)
def test_a_mode_draws_that_many_distinct_ranks_from_its_pool(target: str, count: int) -> None:
    (fault,) = make_plan(scenario(target=target))
    ranks = fault.params["ranks"]
    pool = range(4, 8) if "supernode: 1" in target else range(4) if "supernode: 0" in target else range(8)
    assert len(ranks) == count and len(set(ranks)) == count and set(ranks) <= set(pool)


def test_a_mode_target_follows_the_seed_and_only_the_seed() -> None:
    text = "{mode: fixed, value: 2}"
    draws = {tuple(make_plan(scenario(target=text).with_seed(s))[0].params["ranks"]) for s in range(10)}
    assert len(draws) > 1
    assert make_plan(scenario(target=text))[0].params == make_plan(scenario(target=text))[0].params


@given(
    mode=st.sampled_from(["one", "all", "fixed", "fixed-percent", "random-max-percent"]),
    value=st.integers(1, 100),
    pool=st.lists(st.integers(0, 63), min_size=1, max_size=16, unique=True),
    seed=st.integers(0, 2**32),
)
def test_a_draw_is_distinct_ranks_of_the_pool_never_more_than_the_mode_allows(
    mode: str, value: int, pool: list[int], seed: int
) -> None:
    target: dict[str, Any] = {"mode": mode}
    if mode == "fixed":
        value = min(value, len(pool))
    if mode in ("fixed", "fixed-percent", "random-max-percent"):
        target["value"] = value
    ranks = draw_ranks(target, pool, np.random.default_rng(seed))
    assert ranks == sorted(set(ranks)) and set(ranks) <= set(pool) and ranks
    most = {"one": 1, "all": len(pool), "fixed": value}.get(mode, max(1, len(pool) * value // 100))
    assert len(ranks) <= most
    if mode in ("all", "fixed", "fixed-percent"):
        assert len(ranks) == most


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("{mode: fixed}", "whole number of ranks"),
        ("{mode: fixed, value: 9}", "more than the cluster's 8"),
        ("{mode: fixed-percent, value: 0}", "(0, 100]"),
        ("{mode: one, value: 3}", "takes no value"),
        ("{mode: some}", "unknown mode 'some'"),
        ("{mode: one, rack: 2}", "takes 'target: {rank: N}'"),
        ("{mode: one, supernode: 5}", "supernode must be in 0..1"),
    ],
)
def test_a_bad_mode_target_is_named_with_the_fix(target: str, expected: str) -> None:
    (msg,) = problems(target=target)
    assert expected in msg and "faults[0].target" in msg


def test_a_single_rank_kind_takes_a_rank_or_mode_one_only() -> None:
    (msg,) = problems(kind="hang", target="{mode: fixed, value: 2}")
    assert "hang takes 'target: {rank: N}' or '{mode: one}'" in msg
    (fault,) = make_plan(scenario(kind="hang", target="{mode: one}"))
    assert 0 <= fault.rank < 8


# --- the blast-radius cap ----------------------------------------------------


def test_the_blast_radius_cap_refuses_a_fault_that_can_reach_more_than_half() -> None:
    (msg,) = problems(kind="straggler", target="{mode: fixed-percent, value: 75}")
    assert "can reach 6 of 8 ranks (75 %)" in msg and "blast_radius_percent' to at least 75" in msg
    (msg,) = problems(kind="data_stall", target="{mode: random-max-percent, value: 80}")
    assert "can reach 6 of 8" in msg  # the most it can draw counts, not what this seed drew
    assert make_plan(scenario(target="{supernode: 1}"))[0].params["ranks"] == [4, 5, 6, 7]  # 50 %: allowed


def test_raising_the_cap_in_safeguards_is_the_explicit_override() -> None:
    guard = "safeguards: {blast_radius_percent: 100}"
    (fault,) = make_plan(scenario(kind="data_stall", target="{mode: all}", guard=guard))
    assert fault.params["ranks"] == list(range(8))
    (msg,) = problems(target="{mode: all}", guard="safeguards: {blast_radius_percent: 90}")
    assert "can reach 8 of 8" in msg


# --- triggers ----------------------------------------------------------------


def test_every_n_steps_is_a_fault_per_firing_each_with_its_own_draw() -> None:
    plan = make_plan(scenario(kind="straggler", target="{mode: one}", at="{every: 6, from: 3, until: 25}"))
    assert [f.step for f in plan] == [3, 9, 15, 21]
    assert [f.id for f in plan] == ["f0-straggler@3", "f0-straggler@9", "f0-straggler@15", "f0-straggler@21"]
    draws = {
        tuple(f.params["ranks"])
        for s in range(4)
        for f in make_plan(scenario(kind="straggler", target="{mode: one}", at="{every: 6}").with_seed(s))
    }
    assert len(draws) > 1
    assert [f.step for f in make_plan(scenario(at="{every: 10, during: allreduce}"))] == [10, 20, 30]


def test_a_timed_fault_waits_for_its_virtual_time() -> None:
    (fault,) = make_plan(scenario(kind="hang", at="{time: 2m, during: backward}"))
    assert fault.step == 0 and fault.params["at_time"] == 120.0 and fault.point == "backward"
    assert not due(fault, 5, lambda: 119.9) and due(fault, 5, lambda: 120.0)
    step_fault = PlannedFault("f", "hang", 1, 5, "boundary")
    assert due(step_fault, 5, lambda: 0.0) and not due(step_fault, 6, lambda: 1e9)


@pytest.mark.parametrize(
    ("kind", "at", "expected"),
    [
        ("storage_corrupt", "{time: 1h}", "storage_corrupt fires only at 'step: N'"),
        ("node_kill", "{every: 5, until: 3}", "until (3) is before from (5)"),
        ("node_kill", "{from: 5}", "'from' goes with 'every: N'"),
        ("node_kill", "{every: 5, mtbf: 1h}", "give one trigger"),
        ("node_kill", "{step: 3, during: optimizer}", "use one of boundary, forward, backward, allreduce"),
        ("hang", "{step: 3, during: checkpoint}", "use one of boundary, forward, backward, allreduce"),
    ],
)
def test_a_bad_trigger_is_named_with_the_fix(kind: str, at: str, expected: str) -> None:
    msgs = problems(kind=kind, at=at)
    assert any(expected in m for m in msgs), msgs


def test_during_a_checkpoint_kills_mid_write_of_the_first_checkpoint_at_or_after_the_step() -> None:
    (fault,) = make_plan(scenario(at="{step: 12, during: checkpoint}"))
    assert (fault.step, fault.point) == (15, "shard.mid")
    (msg,) = problems(at="{step: 29, during: checkpoint}", base=BASE.replace("every: 5", "every: 7"))
    assert "no checkpoint is written at or after step 29" in msg


# --- end to end --------------------------------------------------------------

E2E = """\
version: 1
name: modes
seed: 5
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 14, parallel: {dp: 4}, hidden: 32}
policy:
  checkpoint: {every: 4}
  recovery: {strategy: restart, restart_s: 10}
faults:
  - kind: node_kill
    target: {mode: fixed, value: 2}
    at: {step: 6, during: backward}
  - kind: straggler
    target: {mode: one}
    at: {every: 5}
    factor: 2
    for_steps: 1
  - kind: data_stall
    target: {rank: 3}
    at: {time: 30s}
    delay: 2s
    for_steps: 2
expect: {recovered: true, checkpoint_complete: true, matches_uninterrupted: true}
"""


def test_modes_phases_every_and_time_fire_as_planned_in_a_real_run(ray_session: Any, tmp_path: Path) -> None:
    s = parse_scenario(E2E, "modes.yaml")
    result = run(s, tmp_path / "run")
    events = read_journal(result.out_dir / "journal.jsonl")
    fired = [e for e in events if e["event"] == "fault_injected" and e["phase"] == "main"]
    kill = next(e for e in fired if e["kind"] == "node_kill")
    planned = next(f for f in make_plan(s) if f.kind == "node_kill")
    assert kill["params"]["ranks"] == planned.params["ranks"] and len(planned.params["ranks"]) == 2
    assert kill["point"] == "backward" and kill["record"]["armed"] == "backward"
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["step"] == 6 and sorted(failure["dead"]) == planned.params["ranks"]
    assert all(k["point"] == "backward" for k in failure["killed"])
    assert sorted(e["step"] for e in fired if e["kind"] == "straggler") == [5, 10]
    stall = next(e for e in fired if e["kind"] == "data_stall")
    boundary_t = {
        e["step"]: e["t_start"] for e in events if e["event"] == "step_end" and e["phase"] == "main"
    }
    assert stall["params"]["at_time"] == 30.0 and boundary_t[stall["step"]] >= 30.0
    assert result.exit_code == 0, result.summary
