"""policy.preemption's ladder, ``notice >= grace >= launcher timeout >= step + save``, checked with the
job model's figures when a scenario is validated or planned."""

from __future__ import annotations

import pytest

from testbed.core.errors import ScenarioError
from testbed.scenario.job_estimate import scenario_estimate
from testbed.scenario.parse import parse_scenario
from testbed.scenario.plan import plan_warnings
from testbed.scenario.preemption_ladder import preemption_warnings
from tests.conftest import SCENARIOS

QUICKSTART = (SCENARIOS / "quickstart.yaml").read_text()


def with_preemption(notice: float, grace: float, launcher: float, text: str = QUICKSTART) -> str:
    section = f"  preemption: {{notice_s: {notice}, grace_s: {grace}, launcher_timeout_s: {launcher}}}\n"
    return text.replace("policy:\n", "policy:\n" + section, 1)


def test_a_ladder_in_order_warns_nothing_and_no_section_checks_nothing() -> None:
    assert preemption_warnings(parse_scenario(with_preemption(120, 30, 25), "q.yaml")) == []
    assert preemption_warnings(parse_scenario(QUICKSTART, "q.yaml")) == []


def test_each_rung_out_of_order_is_named_with_both_values() -> None:
    (grace,) = preemption_warnings(parse_scenario(with_preemption(60, 70, 50), "q.yaml"))
    assert "grace 70 s" in grace and "notice 60 s" in grace and "the node is gone before SIGKILL" in grace
    (launcher,) = preemption_warnings(parse_scenario(with_preemption(120, 30, 60), "q.yaml"))
    assert "timeout 60 s" in launcher and "grace 30 s" in launcher and "lower launcher_timeout_s" in launcher


def test_a_save_that_cannot_commit_in_time_says_what_bandwidth_would_and_what_is_lost() -> None:
    scenario = parse_scenario(with_preemption(30, 30, 15), "q.yaml")
    est = scenario_estimate(scenario)
    assert est is not None and est.step.total_s + est.checkpoint_write_s > 15  # Llama 3 8B, 105 GiB
    (save,) = preemption_warnings(scenario)
    nbytes = sum(est.checkpoint.values())
    needed = nbytes / (15 - est.step.total_s)
    assert f"a {nbytes / 2**30:.0f} GiB save takes {est.checkpoint_write_s:.1f} s" in save
    assert f"it would fit at {needed / 1e9:.3g} GB/s of storage" in save
    assert "the periodic checkpoint every 10 step(s) loses up to" in save
    assert save in plan_warnings(scenario)  # what validate and plan print
    # a limit shorter than the step itself: no bandwidth helps
    (hopeless,) = preemption_warnings(parse_scenario(with_preemption(30, 30, 5), "q.yaml"))
    assert "no bandwidth makes it fit" in hopeless


def test_without_a_job_only_the_limits_are_checked() -> None:
    text = (SCENARIOS / "storage_io.yaml").read_text()
    text = text.replace(
        "policy:\n", "policy:\n  preemption: {notice_s: 30, grace_s: 30, launcher_timeout_s: 1}\n"
    )
    assert preemption_warnings(parse_scenario(text, "s.yaml")) == []  # the save is not timed


@pytest.mark.parametrize("field", ["notice_s: 0", "grace_s: -5", "launcher_timeout_s: 0"])
def test_a_limit_of_zero_or_below_is_refused(field: str) -> None:
    name = field.split(":")[0]
    text = with_preemption(30, 30, 25).replace(f"{name}: {30 if name != 'launcher_timeout_s' else 25}", field)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "q.yaml")
    assert f"policy.preemption.{name}" in str(err.value)
