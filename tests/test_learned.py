"""Learned timeouts: the recipe's arithmetic, its one promise (never below what was seen), the check,
and a run in which the learned step watchdog finds a hang that the exec timeout would find 30 min later."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.control.runner import run
from testbed.core.journal import read_journal
from testbed.recovery.learned import PHASES, Learner
from testbed.report.checks import run_checks
from testbed.scenario.expect import Expect
from testbed.scenario.model import LearnPolicy
from testbed.scenario.parse import parse_scenario
from tests.conftest import SCENARIOS


def test_the_recipe_is_the_longest_interval_times_the_safety_factor_blended_with_the_saved_value() -> None:
    learner = Learner(LearnPolicy(safety_factor=5, min_samples=3))
    for interval in (2.0, 3.0):
        learner.observe("step", interval)
    assert learner.timeout("step") is None  # two samples of three
    learner.observe("step", 2.5)
    assert learner.timeout("step") == 15.0
    learner.observe("checkpoint", 20.0)
    assert learner.timeout("checkpoint") == 100.0  # rare phases need one sample
    resumed = learner.resumed(learner.values())
    assert resumed.timeout("step") == 15.0  # the saved value stands until enough samples
    for interval in (1.0, 1.0, 1.0):
        resumed.observe("step", interval)
    assert resumed.timeout("step") == pytest.approx(0.5 * 15.0 + 0.5 * 5.0)


@given(
    phase=st.sampled_from(PHASES),
    intervals=st.lists(st.floats(0.0, 1e5), min_size=1, max_size=30),
    saved=st.none() | st.floats(0.0, 1e6),
    safety=st.floats(1.0, 20.0),
    blend=st.floats(0.0, 1.0),
)
def test_a_learned_timeout_is_never_below_the_longest_interval_seen(
    phase: str, intervals: list[float], saved: float | None, safety: float, blend: float
) -> None:
    learner = Learner(LearnPolicy(safety_factor=safety, blend=blend, min_samples=1))
    learner = learner.resumed({phase: saved} if saved is not None else None)
    for interval in intervals:
        learner.observe(phase, interval)
    value = learner.timeout(phase)
    assert value is not None and value >= max(intervals)


def _journal(exceeded: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"event": "timeouts_learned", "phase": "main", "setup": 28.0, "step": 24.0, "checkpoint": 200.0}
    ]
    if exceeded:
        events.insert(
            0,
            {
                "event": "learned_timeout_exceeded",
                "phase_of_job": "step",
                "interval": 30.0,
                "timeout": 24.0,
                "step": 17,
            },
        )
    return events


def test_the_check_fails_when_a_healthy_phase_outlasted_its_learned_timeout() -> None:
    (ok,) = [r for r in run_checks(_journal(False), Expect()) if r.name == "learned_timeouts"]
    assert ok.status == "pass" and "step 24 s" in ok.summary
    (bad,) = [r for r in run_checks(_journal(True), Expect()) if r.name == "learned_timeouts"]
    assert (
        bad.status == "fail" and "a healthy step took 30 s at step 17, past the learned 24 s" in bad.summary
    )
    (off,) = [r for r in run_checks([], Expect()) if r.name == "learned_timeouts"]
    assert off.status == "pass" and "not learned" in off.summary


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("kind", ["hang", "node_kill"])
def test_the_learned_watchdog_finds_a_lost_rank_in_about_five_steps_and_nothing_healthy_trips_it(
    tmp_path: Path, kind: str
) -> None:
    text = (SCENARIOS / "learned_timeouts.yaml").read_text().replace("kind: hang", f"kind: {kind}")
    result = run(parse_scenario(text, f"{kind}.yaml"), tmp_path / kind)
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    events = read_journal(result.out_dir / "journal.jsonl")
    assert not [e for e in events if e["event"] == "learned_timeout_exceeded"]
    learned = result.data["learned_timeouts"]
    steps = [e for e in events if e["event"] == "step_end" and e["phase"] == "main"]
    longest = max(float(e["t"]) - float(e["t_start"]) for e in steps)
    assert learned["step"] >= longest and learned["checkpoint"] > learned["step"]
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["detected_by"] == "learned_step_timeout"
    before = next(e for e in steps if e["step"] == 24)  # the hung step began where this one ended
    latency = float(failure["t"]) - float(before["t"])
    typical = statistics.median(float(e["t"]) - float(e["t_start"]) for e in steps)
    assert 4.5 * typical <= latency <= 5.5 * typical  # about safety factor x step time, not 1836 s
    opens = [e for e in events if e["event"] == "group_open"]
    assert opens[1]["setup_s"] > opens[0]["setup_s"] + 5.0  # the injected setup delay, within its timeout
