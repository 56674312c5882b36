"""What a run leaves for CI and review besides its journal: JUnit XML, the timeline figure, and the
commands that re-render them (report), show the plan (plan) and the library (list)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.report.junit import junit_xml
from testbed.report.timeline_plot import (
    _cut,
    _Gaps,
    _step_boxes,
    divergence_step,
    spans,
    timeline_figure,
)
from tests.conftest import SCENARIOS
from tests.test_cli import cli_in_process


def _report(error: str | None = None) -> dict[str, Any]:
    return {
        "scenario": "demo",
        "seed": 3,
        "verdict": "fail",
        "exit_code": 1,
        "file": "demo.yaml",
        "wall_s": 4.2,
        "error": error,
        "checks": [
            {"name": "recovered", "status": "pass", "summary": "1 failure, 1 recovery"},
            {"name": "checkpoint_complete", "status": "fail", "summary": "missing rng on 2 rank(s)"},
            {"name": "matches_uninterrupted", "status": "unknown", "summary": "no reference run"},
        ],
    }


def test_junit_has_a_case_per_check_a_failure_per_failed_check_and_the_run_error() -> None:
    suite = ET.fromstring(junit_xml(_report()))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) == (
        "3",
        "1",
        "1",
        "0",
    )
    failed = suite.find("testcase[@name='checkpoint_complete']/failure")
    assert failed is not None and failed.get("message") == "missing rng on 2 rank(s)"
    crashed = ET.fromstring(junit_xml(_report(error="HarnessHang: rank 3 stuck")))
    assert crashed.get("errors") == "1" and crashed.find("testcase[@name='run']/error") is not None


def _journal() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n in range(1, 9):
        t0 = 10.0 * n
        events.append(
            {
                "event": "step_end",
                "phase": "main",
                "step": n,
                "t_start": t0,
                "t": t0 + 8.0,
                "loss": 1.0 / n,
                "t_ranks": [t0 + 7.0, t0 + 8.0],
                "compute_s": [6.0, 6.0],
                "comm_wait_s": [1.0, 1.5],
                "data_wait_s": [0.0, 0.5],
                "bubble_s": [0.0, 0.0],
            }
        )
        if n == 4:
            fault = {"id": "f0-node_kill", "kind": "node_kill", "rank": 1, "step": 4, "point": "boundary"}
            events.append({"event": "fault_injected", "phase": "main", **fault, "params": {"ranks": [1]}})
    events.append(
        {
            "event": "recovery_complete",
            "phase": "main",
            "t": 75.0,
            "total_s": 20.0,
            "fail_step": 4,
            "resume_step": 4,
            "strategy": "restart",
            "detected_by": "heartbeat",
            "breakdown": {"detect_s": 5.0, "restart_s": 15.0},
            "wall_recovery_s": 0.5,
        }
    )
    return events


def test_the_timeline_draws_a_journal(tmp_path: Path) -> None:
    path = timeline_figure(_journal(), tmp_path / "timeline.png", "demo")
    assert path.stat().st_size > 10_000


def test_report_re_renders_a_run_and_returns_its_exit_code(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = {
        **_report(),
        "steps": {"planned": 8, "completed": 8, "run": 8},
        "loss": {"first": 1.0, "last": 0.125},
        "faults": [],
        "recoveries": [],
        "journal": str(run_dir / "journal.jsonl"),
    }
    (run_dir / "report.json").write_text(json.dumps(report))
    (run_dir / "journal.jsonl").write_text("\n".join(json.dumps(e) for e in _journal()) + "\n")
    proc = cli_in_process("report", str(run_dir))
    assert proc.returncode == 1, proc.stderr
    assert "verdict: FAIL (exit 1)" in proc.stdout and "FAIL    checkpoint_complete" in proc.stdout
    assert (run_dir / "junit.xml").is_file() and (run_dir / "timeline.png").is_file()
    missing = cli_in_process("report", str(tmp_path / "nothing"))
    assert missing.returncode == 254 and "no report.json and journal.jsonl" in missing.stderr


def test_plan_resolves_the_faults_and_the_first_poisson_arrivals_without_starting_anything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "plan.json"
    proc = cli_in_process("plan", str(SCENARIOS / "checkpoint_sweep.yaml"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "NO_RAY" in proc.stdout and "Poisson process" in proc.stdout
    plan = json.loads(out.read_text())
    (fault,) = plan["faults"]
    assert len(fault["arrivals"]) == 10 and fault["arrivals"][0]["t"] < fault["arrivals"][1]["t"]
    again = tmp_path / "again.json"
    cli_in_process("plan", str(SCENARIOS / "checkpoint_sweep.yaml"), "--out", str(again))
    assert json.loads(again.read_text()) == plan  # the same seed, the same plan


def test_the_plan_hash_covers_the_whole_scenario_not_only_its_faults() -> None:
    from testbed.scenario.parse import load_scenario
    from testbed.scenario.plan import resolved_plan

    quick, incomplete = (
        load_scenario(SCENARIOS / f) for f in ("quickstart.yaml", "incomplete_checkpoint.yaml")
    )
    assert resolved_plan(quick)["faults"] == resolved_plan(incomplete)["faults"]  # they differ elsewhere
    assert resolved_plan(quick)["plan_sha256"] != resolved_plan(incomplete)["plan_sha256"]
    assert resolved_plan(quick)["plan_sha256"] != resolved_plan(quick.with_seed(7))["plan_sha256"]
    assert (
        resolved_plan(quick)["plan_sha256"]
        == resolved_plan(load_scenario(SCENARIOS / "quickstart.yaml"))["plan_sha256"]
    )


def test_plan_names_fixed_targets_and_a_checkpoint_fault_by_the_step_written(tmp_path: Path) -> None:
    proc = cli_in_process("plan", str(SCENARIOS / "storage_corrupt.yaml"), "--out", str(tmp_path / "a.json"))
    assert proc.returncode == 0, proc.stderr
    assert "step   20 checkpoint.committed  storage_corrupt    rank 1" in proc.stdout
    links = cli_in_process(
        "plan", str(SCENARIOS / "link_flap_op_retry.yaml"), "--out", str(tmp_path / "b.json")
    )
    assert "link_flap          1->2, 2->1" in links.stdout
    storage = cli_in_process("plan", str(SCENARIOS / "storage_io.yaml"), "--out", str(tmp_path / "c.json"))
    assert "io_saturation      storage" in storage.stdout
    poisson = cli_in_process(
        "plan", str(SCENARIOS / "checkpoint_sweep.yaml"), "--out", str(tmp_path / "d.json")
    )
    assert "ranks drawn at each arrival (mode one)" in poisson.stdout
    assert "drawn each time" not in links.stdout + storage.stdout + proc.stdout


def test_plan_writes_under_runs_by_default_not_the_working_directory(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "plan", str(SCENARIOS / "quickstart.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs" / "plan-quickstart-seed1234.json").is_file()
    assert not (tmp_path / "plan.json").exists()


def test_list_names_the_library_the_fault_kinds_the_presets_and_the_strategies() -> None:
    proc = cli_in_process("list", "--scenarios", str(SCENARIOS))
    assert proc.returncode == 0, proc.stderr
    for needle in (
        "quickstart.yaml",
        "[smoke, fast, node, checkpoint]",
        "node_kill",
        "atlas-900-a3",
        "elastic",
    ):
        assert needle in proc.stdout
    assert "INVALID" not in proc.stdout


def test_progress_draws_one_line_from_journal_events_and_only_in_a_terminal() -> None:
    import io

    from testbed.report.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Progress.for_terminal(io.StringIO(), 40) is None  # a pipe or a CI log: off
    screen = Tty()
    progress = Progress.for_terminal(screen, 40)
    assert progress is not None
    for event in [
        {"event": "phase_start", "phase": "main"},
        {"event": "step_end", "step": 7, "t": 12.5},
        {"event": "fault_injected", "phase": "main"},
        {"event": "failure_detected"},
        {"event": "recovery_complete"},
    ]:
        progress(event)
    last = screen.getvalue().split("\r\033[K")[-1]
    assert last == "main: step 7/40  faults 1  failures 1  recoveries 1  virtual t=12.5 s"
    progress({"event": "run_end"})
    assert screen.getvalue().endswith("\r\033[K")  # the line is cleared before the summary


def test_a_step_that_waited_for_an_exec_timeout_is_drawn_as_detection_and_retry_hold_not_compute() -> None:
    from tests.test_checks import op_retried_journal

    events = op_retried_journal(1836.0)
    shaded = spans(events)
    assert [(k, round(a, 3), round(b, 3)) for k, a, b in shaded] == [
        ("detection", 1.5, 1837.5),
        ("retry hold", 1837.5, 1842.5),
        ("retry interval", 1842.5, 1843.5),
    ]
    steps = [e for e in events if e["event"] == "step_end"]
    for e in steps:
        e.update(t_ranks=[e["t"]], compute_s=[0.4], comm_wait_s=[0.1], bubble_s=[0.0], data_wait_s=[0.0])
    boxes = _step_boxes(steps, [(a, b) for _, a, b in shaded])
    widths = sorted(round(box[1][0] - box[0][0], 3) for box in boxes["compute_s"])
    assert widths == [0.5, 0.5, 1.0, 1.0]  # step 2 drawn before the loss and after the retry only


_TIMES = st.floats(0, 100, allow_nan=False)


@settings(max_examples=300)
@given(
    st.tuples(_TIMES, st.floats(1e-9, 50)).map(lambda s: [s[0], s[0] + s[1]]),  # a step: start < end
    st.lists(st.tuples(_TIMES, st.floats(0.001, 30)).map(lambda g: (g[0], g[0] + g[1])), max_size=12),
)
def test_a_step_is_cut_by_the_gaps_that_reach_into_it_as_by_all_of_them(
    interval: list[float], gaps: list[tuple[float, float]]
) -> None:
    """The timeline looks up the gaps that reach into a step instead of cutting it by every gap (that
    was quadratic in a long run): the pieces are the same, in the same order."""
    start, end = interval
    assert _cut(start, end, _Gaps(gaps).into(start, end)) == _cut(start, end, gaps)


def test_the_first_step_that_differs_from_the_reference_is_found() -> None:
    def step(phase: str, n: int, digest: str) -> dict[str, Any]:
        return {"event": "step_end", "phase": phase, "step": n, "digest": digest}

    same = [step("main", 1, "a"), step("main", 2, "b"), step("reference", 1, "a"), step("reference", 2, "b")]
    assert divergence_step(same) is None
    assert divergence_step([*same[:1], step("main", 2, "x"), *same[2:]]) == 2
