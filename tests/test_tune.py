"""Timeout tuning: what counts as a false timeout and a detection, the recommendation's rules, and the
tuning scenario, whose recommended values fix both of its false timeouts when it is run again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.control.runner import run
from testbed.core.journal import read_journal
from testbed.experiments.tune import measure, recommend, tune
from testbed.scenario.parse import load_scenario
from tests.conftest import SCENARIOS


def _failure(
    error: str, true_timeout: bool | None, t: float = 100.0, t_death: float = 40.0
) -> dict[str, Any]:
    errs = {"0": {"error": error, "true_timeout": true_timeout, "op": "allreduce"}}
    return {
        "event": "failure_detected",
        "phase": "main",
        "step": 11,
        "t": t,
        "t_death": t_death,
        "errors": errs,
    }


def test_false_and_true_timeouts_are_told_apart_and_detection_is_timed() -> None:
    events = [
        {"event": "plan", "faults": [{"kind": "hang"}, {"kind": "node_kill"}, {"kind": "node_kill"}]},
        _failure("CollectiveTimeout", False),
        _failure("CollectiveTimeout", True, t=160.0, t_death=100.0),
        _failure("PeerLost", None, t=215.0, t_death=200.0),
        {"event": "job_failed", "error_type": "LinkSetupTimeout", "step": 0},
    ]
    found = measure(events)
    assert (found["false_exec"], found["false_setup"], found["detected"], found["missed"]) == (1, 1, 2, 1)
    assert found["latency_s"] == 60.0 and found["first_false"] == "allreduce, step 11"


def _row(value: float, false_setup: int = 0, false_exec: int = 0) -> dict[str, Any]:
    return {"value": value, "false_setup": false_setup, "false_exec": false_exec}


def test_the_recommendation_is_the_smallest_safe_value_kept_on_the_ladder() -> None:
    connect = [_row(120, false_setup=1), _row(300), _row(600)]
    exec_ = [_row(60, false_exec=1), _row(200), _row(400), _row(900)]
    advice = recommend(connect, exec_)
    # 200 s has no false timeout but is not above connect + 20 s = 320 s
    assert (advice["connect_s"], advice["exec_s"], advice["pg_timeout_s"]) == (300, 400, 500)
    assert advice["env"][:2] == ["export HCCL_CONNECT_TIMEOUT=300", "export HCCL_EXEC_TIMEOUT=400"]
    none = recommend([_row(120, false_setup=1)], exec_)
    assert none["connect_s"] is None and "every connect candidate" in none["why"]
    tight = recommend(connect, [_row(60, false_exec=2), _row(300, false_exec=1)])
    assert tight["exec_s"] is None and "no exec candidate above 320 s" in tight["why"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ray_session")
def test_the_tuned_timeouts_fix_the_false_setup_and_checkpoint_timeouts(tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIOS / "timeout_tuning.yaml")
    as_written = run(scenario, tmp_path / "as-written")
    assert as_written.exit_code == 1  # the 120 s connect timeout gives up on links at the modelled scale
    assert measure(read_journal(as_written.out_dir / "journal.jsonl"))["false_setup"] == 1
    summary = tune(scenario, tmp_path / "tune", connect=(120.0, 300.0), exec_=(300.0, 600.0, 1200.0))
    rows = {r["value"]: r for r in summary["exec"]}
    assert rows[300.0]["first_false"] == "barrier, step 0"  # the warm-up's link setup outlasts it
    assert rows[300.0]["missed"] == 1  # the job ended before the real hang
    assert rows[600.0]["false_exec"] == 1 and rows[600.0]["first_false"].endswith("step 11")  # the pause
    advice = summary["recommended"]
    assert (advice["connect_s"], advice["exec_s"]) == (300.0, 1200.0)
    why = "\n".join(summary["explanation"])
    assert "connect 120 s rejected: a link setup outlasted its limit of 140 s" in why
    assert "the slowest link setup took 185.4 s against its limit of 320 s (134.6 s to spare)" in why
    assert (
        "exec 300 s rejected by the ladder" in why and "each also timed out falsely: barrier, step 0" in why
    )
    assert "exec 600 s rejected: a false timeout (allreduce, step 11)" in why
    assert "longest healthy wait in one kind of collective in one step was 900 s (300 s to spare)" in why
    assert "found by exec_timeout" in why and "did not matter" not in why
    tuned = run(load_scenario(summary["tuned"]), tmp_path / "tuned")
    assert (tuned.verdict, tuned.exit_code) == ("pass", 0), tuned.data["checks"]
    found = measure(read_journal(tuned.out_dir / "journal.jsonl"))
    assert (found["false_setup"], found["false_exec"], found["detected"], found["missed"]) == (0, 0, 1, 0)
    assert found["latency_s"] == pytest.approx(1200.0)  # the real hang, caught by the exec timeout
    assert (tmp_path / "tune" / "tune.png").stat().st_size > 10_000


def test_when_the_heartbeat_finds_every_failure_the_tuner_says_the_exec_timeout_did_not_matter() -> None:
    from testbed.experiments.tune import NOT_RUN, explain, table

    def row(value: float, **more: Any) -> dict[str, Any]:
        base = {"value": value, "verdict": "pass", "false_setup": 0, "false_exec": 0, "first_false": None}
        found = {"detected": 1, "missed": 0, "latency_s": 15.0, "detected_by": {"heartbeat": 1}}
        return {**base, **found, "setup_max_s": 3.1, "wait_max_s": 0.28, **more}

    connect, exec_ = [row(120.0)], [row(60.0), row(120.0), row(300.0), row(1836.0)]
    advice = recommend(connect, exec_)
    why = "\n".join(explain(connect, exec_, advice, [300.0, 600.0]))
    assert advice["exec_s"] == 300.0
    assert "exec 60, 120 s rejected by the ladder" in why and "also timed out" not in why
    assert "connect 300, 600 s not run: above a safe connect timeout" in why
    assert "exec 1836 s safe too, and no slower here" in why
    assert "found by heartbeat (4 time(s)" in why and "the exec timeout did not matter here" in why
    assert "policy.detection: null" in why
    shown = table([row(120.0), {"value": 300.0, "verdict": NOT_RUN}], "connect_s")
    assert "| 300 | not run | - |" in shown and "heartbeat 1" in shown
