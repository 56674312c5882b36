"""Drills: schedules drawn from a seed, a broken policy found and shrunk, the replay reproducing it."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.kind import kinds
from testbed.cli import main
from testbed.core.journal import read_journal
from testbed.scenario.parse import load_scenario
from testbed.testing.drill import differences, render, run_drill
from testbed.testing.schedules import (
    fault_schedules,
    layouts,
    policies,
    scenario_yaml,
    topologies,
    with_faults,
)
from tests.conftest import SCENARIOS

BASE = load_scenario(SCENARIOS / "drill.yaml")
BROKEN = load_scenario(SCENARIOS / "drill_tight_exec.yaml")
SLOWING = ("straggler", "data_stall", "checkpoint_pause")  # kinds that slow the job, none that kill


@settings(max_examples=60)
@given(fault_schedules(BASE, max_faults=3))
def test_a_drawn_schedule_is_a_valid_scenario_sorted_and_able_to_coexist(
    schedule: list[dict[str, Any]],
) -> None:
    scenario = with_faults(BASE, schedule)
    assert len(scenario.faults) == len(schedule) <= 3
    steps = [f["at"]["step"] for f in schedule]
    assert steps == sorted(steps)
    fatal_steps = [f["at"]["step"] for f in schedule if kinds()[f["kind"]].ends_process]
    assert len(fatal_steps) == len(set(fatal_steps))


@given(st.integers(1, 16).flatmap(lambda w: st.tuples(st.just(w), layouts(w))))
def test_a_layout_fits_its_world(drawn: tuple[int, dict[str, int]]) -> None:
    world, layout = drawn
    product = 1
    for degree in layout.values():
        product *= degree
    assert product == world


@settings(max_examples=20)
@given(st.data())
def test_drawn_clusters_layouts_and_policies_make_a_valid_scenario(data: st.DataObject) -> None:
    cluster = data.draw(topologies())
    world = cluster["supernodes"] * cluster["npus_per_supernode"]
    parallel = data.draw(layouts(world, axes=("dp", "tp", "pp")))
    doc = {
        "version": 1,
        "name": "drawn",
        "cluster": cluster,
        "workload": {"name": "transformer", "steps": 12, "parallel": parallel},
        "policy": data.draw(policies(steps=12)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "drawn.yaml"
        path.write_text(yaml.safe_dump(doc))
        scenario = load_scenario(path)
        assert scenario.cluster.topology().world == world == scenario.workload.layout().world
        schedule = data.draw(fault_schedules(scenario, max_faults=2))
        assert len(with_faults(scenario, schedule).faults) == len(schedule)


def test_a_broken_schedule_written_out_is_a_plain_scenario_file(tmp_path: Path) -> None:
    schedule = [{"kind": "node_kill", "target": {"rank": 1}, "at": {"step": 6}}]
    path = tmp_path / "s.yaml"
    path.write_text(scenario_yaml(BROKEN, schedule, "x"))
    again = load_scenario(path)
    assert again.name == "x" and again.faults[0].kind == "node_kill" and again.seed == BROKEN.seed


def test_the_determinism_check_names_what_differs(tmp_path: Path) -> None:
    journal = [{"event": "step_end", "phase": "main", "step": 1, "t": 1.0}]
    (tmp_path / "journal.jsonl").write_text('{"event": "step_end", "phase": "main", "step": 1, "t": 1.5}\n')
    a = {"plan_sha256": "p", "final_digest": "d"}
    found = differences(a, journal, {"plan_sha256": "q", "final_digest": "e"}, tmp_path)["determinism"]
    assert found[0] == "plan p != q"
    assert "virtual times differ" in found[1] and "1.0" in found[1] and "1.5" in found[1]
    assert found[2].startswith("final parameters differ")
    (tmp_path / "journal.jsonl").write_text('{"event": "step_end", "phase": "main", "step": 1, "t": 1.0}\n')
    assert differences(a, journal, dict(a), tmp_path) == {}


def test_the_broken_policy_passes_as_written(testbed_run: Any) -> None:
    result = testbed_run(BROKEN)
    assert result.verdict == "pass" and any("timeout ladder" in w for w in result.data["warnings"])


@pytest.mark.slow
def test_a_drill_finds_an_exec_timeout_shorter_than_a_checkpoint_pause_and_the_replay_reproduces_it(
    ray_session: Any, tmp_path: Path
) -> None:
    result = run_drill(BROKEN, seed=5, budget_s=45, out_dir=tmp_path / "drill", kinds=SLOWING)
    assert result.minimal is not None and result.exit_code == 1, [e.problems for e in result.examples]
    assert 1 <= len(result.minimal.faults) <= 3
    assert any(f["kind"] == "checkpoint_pause" for f in result.minimal.faults)
    assert any(p.startswith("failures:") for p in result.minimal.problems["expect"])
    assert result.replay == f"testbed run {result.minimal_file}"
    suite = ET.parse(tmp_path / "drill" / "junit.xml").getroot()
    assert int(suite.get("failures", "0")) >= 1 and len(suite) == len(result.examples)
    kept = [e.run_dir for e in result.examples if e.failed]
    assert all((d / "report.json").is_file() for d in kept)
    for attempt in (1, 2):  # the replay command reproduces it, twice in a row
        out = tmp_path / f"replay{attempt}"
        assert main(["run", str(result.minimal_file), "--out", str(out)]) == 1
        events = read_journal(out / "journal.jsonl")
        (failure,) = [e for e in events if e["event"] == "failure_detected"]
        assert failure["detected_by"] == "exec_timeout" and failure["dead"] == []


@pytest.mark.slow
def test_a_drill_with_the_determinism_check_passes_on_a_healthy_base(
    ray_session: Any, tmp_path: Path
) -> None:
    result = run_drill(
        BASE, seed=11, budget_s=300, out_dir=tmp_path / "drill", check_determinism=True, schedules=2
    )
    assert len(result.examples) == 2  # the count ends the search, not the budget
    assert result.exit_code == 0, [(e.faults, e.problems) for e in result.examples if e.failed]
    assert "2 schedule(s) run, 0 failing" in render(result)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--budget", "soon"], "--budget 'soon' is not a positive duration"),
        (["--kinds", "node_kill,meteor"], "a drill draws from node_kill, straggler"),
        (["--max-faults", "0"], "--max-faults is 1..10"),
        (["--seed", "-1"], "--seed is a non-negative integer"),
        (["--schedules", "0"], "--schedules 0: give 1 or more"),
    ],
)
def test_bad_drill_arguments_exit_254_naming_the_fix(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drill", str(SCENARIOS / "drill.yaml"), *args]) == 254
    assert expected in capsys.readouterr().err


def test_a_drill_of_a_missing_scenario_exits_254(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["drill", str(tmp_path / "nope.yaml")]) == 254
    assert "cannot read the scenario file" in capsys.readouterr().err


def test_on_one_npu_no_capped_kind_is_drawn(tmp_path: Path) -> None:
    from testbed.testing.schedules import usable_kinds

    path = tmp_path / "one.yaml"
    path.write_text(
        (SCENARIOS / "drill.yaml")
        .read_text()
        .replace("supernodes: 2, npus_per_supernode: 2", "supernodes: 1, npus_per_supernode: 1")
        .replace("parallel: {dp: 4}", "parallel: {dp: 1}")
    )
    one = load_scenario(path)
    # the controller is not a rank: the blast-radius cap does not hold it back
    assert usable_kinds(one) == ["checkpoint_pause", "hang", "storage_corrupt", "controller_kill"]
    assert "node_kill" in usable_kinds(BASE) and "partition" in usable_kinds(BASE)  # two supernodes


def test_a_spent_budget_ends_the_search_instead_of_refusing_draws_one_by_one(tmp_path: Path) -> None:
    from testbed.testing.drill import BudgetSpent, Drill

    drill = Drill(BASE, seed=1, budget_s=0.0, out_dir=tmp_path)
    time.sleep(0.01)
    with pytest.raises(BudgetSpent):
        drill.fails([{"kind": "straggler", "target": {"rank": 1}, "at": {"step": 2}}])
    assert drill.examples == []
