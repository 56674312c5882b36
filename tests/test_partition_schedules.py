"""Hypothesis over partitions as drills draw them: the side cut off, the step, the direction, the heal,
and whether the controller is cut off too.

Whatever is drawn, the run recovers, keeps the drill's invariants, has one
parameter history per step, makes progress after the heal, lets no zombie's
commit land (the base fences by epoch), and ends bit for bit equal to an
uninterrupted run.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.kind import kinds
from testbed.core.journal import read_journal
from testbed.report.invariants import broken
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.testing.schedules import draw_facts
from tests.conftest import SCENARIOS

BASE = load_scenario(SCENARIOS / "drill.yaml")


@st.composite
def partitions(draw: Any) -> dict[str, Any]:
    """One partition entry for the drill base, drawn as drills draw it."""
    return dict(kinds()["partition"].draw(draw, draw_facts(BASE), 0))


@pytest.mark.ray
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=partitions())
def test_any_drawn_partition_recovers_with_one_history_and_no_zombie_write_landing(
    testbed_runs: Any, entry: dict[str, Any]
) -> None:
    text = (SCENARIOS / "drill.yaml").read_text() + yaml.safe_dump({"faults": [entry]})
    scenario = parse_scenario(text, "drawn.yaml")
    report = testbed_runs(scenario)
    checks = {c["name"]: c for c in report.data["checks"]}
    for name in ("recovered", "one_history", "matches_uninterrupted", "checkpoint_complete"):
        assert checks[name]["status"] == "pass", (entry, name, checks[name]["summary"])
    assert checks["heal_progress"]["status"] != "fail", (entry, checks["heal_progress"]["summary"])
    if "zombies_fenced" in checks:
        assert checks["zombies_fenced"]["status"] != "fail", (entry, checks["zombies_fenced"]["summary"])
    events = read_journal(report.out_dir / "journal.jsonl")
    assert broken(events, report.out_dir) == {}, entry
    assert any(e["event"] == "fault_injected" and e.get("kind") == "partition" for e in events), entry
