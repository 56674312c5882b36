"""Failures as a Poisson process, the field sweep, and the checkpoint interval against Young/Daly."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from faults.arrivals import Arrivals
from faults.kind import PlannedFault
from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.experiments.sweep import Point, fitted_optimum, job_mtbf, with_field, young_daly
from testbed.scenario.parse import parse_scenario
from testbed.scenario.plan import make_plan
from tests.conftest import SCENARIOS

BASE = (SCENARIOS / "checkpoint_sweep.yaml").read_text()


def _process(mtbf: float = 100.0, ranks: list[int] | None = None) -> Arrivals:
    params = {"ranks": ranks or [], "mtbf": mtbf, "target": {"mode": "one"}, "pool": list(range(8))}
    fault = PlannedFault("f0-node_kill", "node_kill", -1, 0, "boundary", {**params, "stream": "k"})
    return Arrivals.start(fault, seed=5)


def test_arrivals_do_not_depend_on_when_they_are_asked_for() -> None:
    coarse, fine = _process(), _process()
    a = [
        (f.params["t_arrival"], f.params["ranks"])
        for now in (500.0, 1000.0, 3000.0)
        for f in coarse.due(now, 1)
    ]
    b = [
        (f.params["t_arrival"], f.params["ranks"])
        for now in range(0, 3001, 7)
        for f in fine.due(float(now), 1)
    ]
    assert a == b and len(a) > 10
    assert all(0 <= r[0] < 8 for _, r in a)
    assert len({r[0] for _, r in a}) > 1  # a random target is drawn at each arrival


def test_arrivals_have_the_mean_time_between_failures_asked_for() -> None:
    p = _process(mtbf=100.0, ranks=[3])
    times = [f.params["t_arrival"] for f in p.due(200_000.0, 1)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(gaps) / len(gaps) == pytest.approx(100.0, rel=0.05)
    assert all(f == [3] for f in (x.params["ranks"] for x in _process(ranks=[3]).due(1000.0, 1)))


def test_an_mtbf_fault_is_planned_as_a_process_not_a_step() -> None:
    scenario = parse_scenario(BASE, "base.yaml")
    (fault,) = make_plan(scenario)
    assert fault.step == 0 and fault.params["mtbf"] == 1800.0 and fault.params["ranks"] == []
    assert job_mtbf(scenario) == 1800.0


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("{mtbf: -5}", "positive duration"),
        ("{mtbf: soon}", "positive duration"),
        ("{mtbf: 1h, step: 3}", "cannot go with mtbf"),
    ],
)
def test_a_bad_mtbf_is_rejected_with_the_fix(at: str, message: str) -> None:
    text = BASE.replace("at: {mtbf: 30min}", f"at: {at}")
    assert text != BASE
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "bad.yaml")
    assert message in str(err.value) and "faults[0].at" in str(err.value)


def test_a_sweep_changes_only_its_field_and_can_add_a_failure_process() -> None:
    s = with_field(BASE, "base.yaml", "policy.checkpoint.every", 6)
    assert s.policy.checkpoint.every == 6 and s.seed == parse_scenario(BASE, "b.yaml").seed
    two = with_field(BASE, "base.yaml", "policy.checkpoint.every", 6, mtbf=3600.0)
    assert len(two.faults) == 2 and job_mtbf(two) == pytest.approx(1200.0)  # rates add: 1/1800 + 1/3600
    with pytest.raises(ScenarioError) as err:
        with_field(BASE, "base.yaml", "policy.checkpoint.every", -1)
    assert "every" in str(err.value)


def test_the_fitted_optimum_is_the_maximum_of_youngs_form_through_the_points() -> None:
    def point(value: int, goodput: float) -> Point:
        return Point(value, "pass", goodput, 20, 50, (20.0,), 30.0, 1e5, 20.0)

    curve = [point(k, 0.95 - 0.32 / k - 0.005 * k) for k in (3, 4, 6, 8, 12, 16, 24)]
    assert fitted_optimum(curve) == pytest.approx((0.32 / 0.005) ** 0.5)  # 8 steps
    noisy = [point(p.value, p.goodput + (0.01 if p.value == 12 else 0.0)) for p in curve]
    assert max(noisy, key=lambda p: p.goodput).value == 12  # one lucky point wins the best ...
    assert fitted_optimum(noisy) == pytest.approx(8.0, rel=0.15)  # ... but hardly moves the fit
    assert fitted_optimum(curve[:2]) is None  # too few points
    assert fitted_optimum([*curve[:2], curve[1]]) is None  # three points, two intervals
    failed = [dataclasses.replace(p, verdict="fail", goodput=0.0) if p.value == 8 else p for p in curve]
    assert fitted_optimum(failed) == pytest.approx(8.0)  # a failed run's goodput is left out
    assert fitted_optimum([point(k, 0.5 + 0.01 * k) for k in (3, 6, 12)]) is None  # no maximum


def test_young_daly_takes_the_measured_cost_and_step_time() -> None:
    def point(value: int, costs: tuple[float, ...], step_s: float) -> Point:
        return Point(value, "pass", 0.8, 20, 50, costs, step_s, 1e5, 20.0)

    yd = young_daly([point(6, (70.0, 74.0), 59.0), point(12, (72.0,), 61.0)], 3600.0)
    assert yd["checkpoint_cost_s"] == pytest.approx(72.0) and yd["step_s"] == pytest.approx(60.0)
    assert yd["young_s"] == pytest.approx(720.0) and yd["young_steps"] == pytest.approx(12.0)
    assert yd["daly_steps"] == pytest.approx((720.0 - 72.0) / 60.0)
    with pytest.raises(ScenarioError):
        young_daly([point(6, (), 60.0)], 3600.0)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("ray_session")
def test_the_measured_optimum_of_a_real_job_is_within_1_5x_of_young_daly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.control import shared_reference
    from testbed.experiments.sweep import sweep

    replays: list[int] = []
    replay = shared_reference.replay
    monkeypatch.setattr(
        shared_reference, "replay", lambda j, kept, epoch: (replays.append(epoch), replay(j, kept, epoch))
    )
    summary = sweep(SCENARIOS / "checkpoint_sweep.yaml", "policy.checkpoint.every", [4, 8, 16], tmp_path)
    assert len(replays) == 2  # the interval is no part of the reference run: one ran, two replayed it
    yd = summary["young_daly"]
    # the job's figures: a 22.5 s checkpoint write, 36.9 s steps, an NPU lost every 30 min on average
    assert yd["checkpoint_cost_s"] == pytest.approx(22.48, rel=0.01)
    assert yd["step_s"] == pytest.approx(36.93, rel=0.01)
    assert yd["young_steps"] == pytest.approx(7.7, rel=0.02)
    assert 1 / 1.5 <= summary["fitted_over_optimum"] <= 1.5, summary["table"]
    assert 1 / 1.5 <= summary["best_over_optimum"] <= 1.5, summary["table"]
    # the same failures at every interval: the arrival times are the process's, not the policy's
    arrivals = []
    for every in (4, 8, 16):
        events = read_journal(tmp_path / f"every={every}" / "journal.jsonl")
        times = [e["params"]["t_arrival"] for e in events if e["event"] == "fault_injected"]
        arrivals.append(times[:15])
    assert arrivals[0] == arrivals[1] == arrivals[2] and len(arrivals[0]) == 15
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    goodputs = {p["value"]: p["goodput"] for p in summary["points"]}
    assert goodputs[8] > goodputs[4] and goodputs[8] > goodputs[16]  # 8 is the nearest to 7.7
    assert json.loads((tmp_path / "sweep.json").read_text())["fitted_steps"] == summary["fitted_steps"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_sweep_of_exec_timeouts_picks_the_one_that_costs_least_in_all(tmp_path: Path) -> None:
    from testbed.experiments.sweep import sweep

    values = [60, 300, 1836]
    summary = sweep(SCENARIOS / "link_flap_allreduce.yaml", "policy.timeouts.exec_s", values, tmp_path)
    points = {p["value"]: p for p in summary["points"]}
    assert summary["best"] == 60, summary["table"]
    assert min(points, key=lambda v: points[v]["virtual_time_s"]) == 60
    assert points[60]["goodput"] > points[300]["goodput"] > points[1836]["goodput"]
    events = read_journal(tmp_path / "exec_s=1836" / "journal.jsonl")
    (rec,) = [e for e in events if e["event"] == "recovery_complete" and e["phase"] == "main"]
    assert rec["strategy"] == "op_retry" and rec["breakdown"]["detect_s"] == 1836.0
    (fired,) = [e for e in events if e["event"] == "fault_injected"]
    assert fired["record"]["anchor"] == "grad_sync" and fired["record"]["length_s"] == 12.0
    (healed,) = [e for e in events if e["event"] == "fault_healed"]
    assert healed["t"] >= rec["t_death"]  # healed at a boundary after the window it started in the allreduce
    # the replay line a point prints runs that point again, pasted as printed
    import shlex

    from testbed.cli import main

    replay = points[60]["replay"]
    assert replay.startswith("testbed run ") and "--set policy.timeouts.exec_s=60 --seed 7" in replay
    assert main([*shlex.split(replay)[1:], "--out", str(tmp_path / "replayed")]) == 0
    again = json.loads((tmp_path / "replayed" / "report.json").read_text())
    first = json.loads((tmp_path / "exec_s=60" / "report.json").read_text())
    assert (
        again["final_digest"] == first["final_digest"] and again["virtual_time_s"] == first["virtual_time_s"]
    )
