"""Hypothesis over preemptions: the policy (save, abort, none), the window, the target and the point.

Whatever is drawn, the run recovers, keeps the drill's invariants, never
publishes a partial checkpoint, saves one step on every rank, loses more
work than its policy promises only when its emergency save missed the
deadline (the window ran out first), and ends bit for bit equal to an
uninterrupted run; a save with time for it commits and loses nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from testbed.core.journal import read_journal
from testbed.report.invariants import broken
from testbed.scenario.parse import parse_scenario

BASE = """\
version: 1
name: preempt-drawn
seed: 5
cluster: {{preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}}
workload: {{name: mlp, steps: 10, parallel: {{dp: 4}}, hidden: 32}}
policy:
  checkpoint: {{every: 4}}
  detection: {{heartbeat_s: 5, missed: 3}}
  recovery: {{strategy: restart, max_restarts: 3, restart_s: 10}}
  preemption: {{notice_s: 120, grace_s: 120, launcher_timeout_s: 120, on_notice: {on_notice}}}
safeguards: {{blast_radius_percent: 100}}
faults:
  - {{kind: preempt, target: {target}, at: {{step: {step}, during: {during}}}, grace_s: {grace}}}
"""

#: windows (s) against the base's steps of about 12 us: none fits a step, one fits a few, one all
WINDOWS = (1e-6, 4e-5, 30.0)


@st.composite
def preemptions(draw: Any) -> dict[str, Any]:
    """One preemption of the base: its policy, target, step, point and window."""
    on_notice = draw(st.sampled_from(["save", "abort", "none"]))
    windows = WINDOWS if on_notice != "none" else WINDOWS[:2]  # without a handler 30 s outlasts the run
    return {
        "on_notice": on_notice,
        "target": draw(st.sampled_from(["{rank: 1}", "{supernode: 1}", "{mode: all}"])),
        "step": draw(st.integers(2, 9)),
        "during": draw(st.sampled_from(["boundary", "forward", "backward", "allreduce"])),
        "grace": draw(st.sampled_from(windows)),
    }


@pytest.mark.ray
@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=preemptions())
# found by this test: a window that ran out in the agreement (save) or the re-link after an abort
@example(case={"on_notice": "save", "target": "{rank: 1}", "step": 2, "during": "boundary", "grace": 1e-6})
@example(case={"on_notice": "abort", "target": "{rank: 1}", "step": 2, "during": "boundary", "grace": 1e-6})
def test_any_preemption_keeps_the_invariants_and_the_policys_promise(
    testbed_runs: Any, case: dict[str, Any]
) -> None:
    text = BASE.format(**{**case, "grace": f"{case['grace']:.6f}"})  # YAML reads 1e-06 as text
    report = testbed_runs(parse_scenario(text, "drawn.yaml"))
    checks = {c["name"]: c for c in report.data["checks"]}
    assert checks["recovered"]["status"] == "pass", (case, report.data["error"], checks["recovered"])
    for name in ("preemption_no_partial", "preemption_same_step"):
        if name in checks:
            assert checks[name]["status"] != "fail", (case, checks[name]["summary"])
    if checks.get("preemption_lost_work", {}).get("status") == "fail":  # only a save that missed
        assert checks["preemption_commit"]["status"] == "fail", (case, checks["preemption_lost_work"])
    assert checks["matches_uninterrupted"]["status"] == "pass", (case, checks["matches_uninterrupted"])
    events = read_journal(report.out_dir / "journal.jsonl")
    assert broken(events, report.out_dir) == {}, case
    assert any(e["event"] == "preempt_notice" for e in events), case
    if case["on_notice"] == "save" and case["grace"] == WINDOWS[-1]:
        assert checks["preemption_commit"]["status"] == "pass", (case, checks["preemption_commit"])
        (cycle,) = checks["preemption_lost_work"]["evidence"]["cycles"]
        assert cycle["lost_steps"] == 0, case
