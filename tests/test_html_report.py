"""``report.html`` and the suite's index: built from the journal, self-contained, and right in a real browser.

The browser tests drive headless Chromium (tests/browser.py). Without one they
skip, saying how to get one; with ``TESTBED_REQUIRE_BROWSER=1`` (as .ci/run
sets) a missing browser fails them instead, so CI never passes them silently.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.core.journal import read_journal
from testbed.report.html_report import render
from testbed.report.html_suite import suite_page
from testbed.report.html_timeline import fault_windows, lane_ranks, rank_shapes
from tests.browser import HOW_TO_GET_ONE, Chromium, find_chromium
from tests.conftest import SCENARIOS

RUNS = ("quickstart", "link_flap_op_retry")


def _browser() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("TESTBED_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TESTBED_REQUIRE_BROWSER=1 but {HOW_TO_GET_ONE}")
        pytest.skip(HOW_TO_GET_ONE)
    return binary


@pytest.fixture(scope="module")
def suite_dir(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two library scenarios run as a suite with ``--html``, on the session's Ray."""
    out = tmp_path_factory.mktemp("suite")
    files = [str(SCENARIOS / f"{name}.yaml") for name in RUNS]
    assert main(["suite", *files, "--out", str(out), "--html", str(out / "html")]) == 0
    return out


def _report(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return json.loads((run_dir / "report.json").read_text()), read_journal(run_dir / "journal.jsonl")


# --- the page as built (no browser) ---------------------------------------------------------------


def _journal(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    step = {
        "event": "step_end",
        "phase": "main",
        "compute_s": [2.0, 2.0],
        "comm_wait_s": [0.5, 0.25],
        "bubble_s": [0.0, 0.0],
        "data_wait_s": [0.0, 0.0],
        "t_ranks": [2.5, 2.25],
        "t_start": 0.0,
        "t": 2.5,
    }
    return [{"event": "run_start", "world": 2}, {**step, "step": 1}, *extra]


def test_a_fault_window_runs_from_its_injection_to_its_heal_or_its_recovery() -> None:
    link = {"event": "fault_injected", "phase": "main", "id": "f0", "kind": "link_flap", "step": 2}
    link["record"] = {"t0": 3.0, "t_end": 9.0}
    kill = {"event": "fault_injected", "phase": "main", "id": "f1", "kind": "node_kill", "step": 2, "rank": 1}
    healed = {"event": "fault_healed", "phase": "main", "id": "f0", "kind": "link_flap", "t": 8.0}
    done = {"event": "recovery_complete", "phase": "main", "t": 30.0, "t_resume": 20.0, "fail_step": 2}
    windows = {w.fault: (w.a, w.b, w.label) for w in fault_windows(_journal(link, kill, healed, done))}
    assert windows["f0"] == (3.0, 8.0, "link_flap (step 2)")  # healed at 8 s, before the planned 9 s
    assert windows["f1"] == (2.5, 20.0, "node_kill rank 1 (step 2)")  # from the step's end to training again
    assert lane_ranks(_journal()) == [0, 1]
    anchored = {**link, "id": "f2", "record": {"t0": None, "anchor": "grad_sync", "length_s": 12.0}}
    (window,) = fault_windows(_journal(anchored))
    assert (window.a, window.b) == (2.5, 14.5)  # from the step it fired in, for its planned length


@pytest.mark.ray
def test_a_step_is_drawn_as_it_ran_when_the_journal_keeps_its_collectives_and_by_part_otherwise() -> None:
    ops = {
        "t_start": 0.0,
        "run": [["allreduce", "ring", "dp@0", 4096, 1.0, 1.5], ["recv", "p2p", "pp@0", 8, 2.0, 2.1]],
    }
    step = {**_journal()[1], "ops": {"0": ops}}
    shapes = [(s.lane, s.kind, s.a, s.b) for s in rank_shapes([_journal()[0], step]) if s.lane >= 0]
    assert shapes[:5] == [
        (0, "compute", 0.0, 1.0),
        (0, "collective", 1.0, 1.5),
        (0, "compute", 1.5, 2.0),
        (0, "bubble", 2.0, 2.1),
        (0, "compute", 2.1, 2.5),  # to the rank's end (t_ranks)
    ]
    assert shapes[5:] == [(1, "compute", 0.0, 2.0), (1, "communication wait", 2.0, 2.25)]  # no ops: by part


def test_the_page_needs_nothing_from_the_network_and_names_every_check(suite_dir: Path) -> None:
    report, events = _report(suite_dir / "quickstart")
    html = (suite_dir / "quickstart" / "report.html").read_text()
    assert html == render(report, events)  # what `testbed report --html` rebuilds is what the run wrote
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must not load anything"
    assert "@import" not in html and "url(http" not in html
    rows = re.findall(r'<tr class="status-(\w+)" data-name="(\w+)"', html)
    assert [(n, s) for s, n in rows] == [(c["name"], c["status"]) for c in report["checks"]]
    assert html.count('class="lane"') == 8 and "node_kill rank 5 (step 27)" in html
    # the steps as they ran: each rank's gradient allreduce of a step in its place, with its bytes
    assert "rank 5 step 27: allreduce (hierarchical, group world), 16,246,193,276 bytes" in html


@pytest.mark.ray
def test_testbed_report_html_rebuilds_the_page_from_the_journal(suite_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(suite_dir / "link_flap_op_retry", run)
    kept = (run / "report.html").read_text()
    (run / "report.html").unlink()
    assert main(["report", str(run), "--html"]) == 0
    assert (run / "report.html").read_text() == kept
    assert main(["report", str(tmp_path / "nowhere"), "--html"]) == 254


def test_the_suite_page_links_each_run_and_names_what_was_not_as_declared(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.html").write_text("<html></html>")
    row = {"scenario": "a", "file": "a.yaml", "tags": ["fast"], "declared": "pass", "wall_s": 1.0}
    rows = [
        {**row, "got": "pass", "as_declared": True, "why": "", "run_dir": str(tmp_path / "a")},
        {**row, "scenario": "b", "got": "fail", "as_declared": False, "why": "it failed", "run_dir": None},
    ]
    html = suite_page(rows, tmp_path / "index")
    assert 'href="../a/report.html"' in html
    assert "1 of 2 scenario(s) came to what they declare" in html and "<b>NO</b>: it failed" in html


# --- in a real browser ----------------------------------------------------------------------------


def _blank(png: bytes) -> bool:
    """Whether a screenshot is (nearly) one colour."""
    import io

    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png")[..., :3]
    return float(pixels.std()) < 0.02


@pytest.mark.ray
@pytest.mark.parametrize("name", RUNS)
def test_a_runs_page_renders_in_chromium_with_a_lane_per_rank_and_every_fault(
    suite_dir: Path, name: str
) -> None:
    binary = _browser()
    report, events = _report(suite_dir / name)
    injected = [e for e in events if e.get("event") == "fault_injected" and e.get("phase") == "main"]
    with Chromium(binary) as browser:
        browser.open(suite_dir / name / "report.html")
        assert browser.console_errors() == []
        assert browser.evaluate("document.querySelectorAll('#timeline g.lane').length") == len(
            lane_ranks(events)
        )
        labels = browser.evaluate(
            "[...document.querySelectorAll('#timeline .fault-label')].map(t => t.textContent)"
        )
        assert labels == [w.label for w in fault_windows(events)] and len(labels) == len(injected) > 0
        widths = browser.evaluate(
            "[...document.querySelectorAll('#timeline .fault-window')].map(r => r.getBBox().width)"
        )
        assert len(widths) == len(injected) and all(w > 0 for w in widths)
        checks = browser.evaluate(
            "[...document.querySelectorAll('#checks tbody tr')].map(r => [r.dataset.name, r.dataset.status])"
        )
        assert checks == [[c["name"], c["status"]] for c in report["checks"]]
        assert browser.evaluate("document.getElementById('verdict').textContent") == report["verdict"].upper()
        first = browser.evaluate("document.querySelector('#timeline rect.part').getAttribute('x')")
        browser.evaluate("document.querySelector('#zoom button[data-zoom=\"0.5\"]').click()")
        assert browser.evaluate("document.querySelector('#timeline rect.part').getAttribute('x')") != first
        assert not _blank(browser.screenshot())
        assert browser.console_errors() == []


@pytest.mark.ray
def test_a_runs_page_reads_with_scripts_off(suite_dir: Path) -> None:
    binary = _browser()
    with Chromium(binary) as browser:
        browser.call("Emulation.setScriptExecutionDisabled", value=True)
        browser.open(suite_dir / "quickstart" / "report.html")
        assert browser.evaluate("document.querySelectorAll('#timeline g.lane').length") == 8
        assert browser.evaluate("document.querySelectorAll('#timeline rect.part').length") > 100
        assert browser.evaluate("getComputedStyle(document.getElementById('zoom')).display") == "none"
        assert not _blank(browser.screenshot())


@pytest.mark.ray
def test_the_suite_page_renders_in_chromium_and_links_to_each_run(suite_dir: Path) -> None:
    binary = _browser()
    rows = json.loads((suite_dir / "suite.json").read_text())
    with Chromium(binary) as browser:
        browser.open(suite_dir / "html" / "index.html")
        assert browser.console_errors() == []
        links = browser.evaluate("[...document.querySelectorAll('table.suite a')].map(a => a.href)")
        assert [Path(link.removeprefix("file://")) for link in links] == [
            (Path(r["run_dir"]) / "report.html").resolve() for r in rows
        ]
        assert browser.evaluate("document.querySelectorAll('table.suite tbody tr').length") == len(RUNS)
        assert not _blank(browser.screenshot())


def test_a_blank_screenshot_is_told_from_a_drawn_one() -> None:
    import io

    import numpy as np
    from matplotlib import image

    def png(pixels: Any) -> bytes:
        buffer = io.BytesIO()
        image.imsave(buffer, pixels, format="png")
        return buffer.getvalue()

    white = np.ones((40, 60, 3))
    drawn = white.copy()
    drawn[10:30, 5:50] = (0.3, 0.45, 0.7)
    assert _blank(png(white)) and not _blank(png(drawn))


def test_a_failing_drills_page_shows_the_smallest_schedule_and_the_replay_command(tmp_path: Path) -> None:
    from testbed.report.html_suite import drill_page

    (tmp_path / "examples" / "002").mkdir(parents=True)
    (tmp_path / "examples" / "002" / "report.html").write_text("<html></html>")
    fault = {"kind": "node_kill", "target": {"rank": 1}, "at": {"step": 4}}
    failing = {"index": 2, "faults": [fault], "verdict": "fail", "problems": {"expect": ["recovered: no"]}}
    drill = {
        "seed": 7,
        "failed": 1,
        "examples": [
            {"index": 1, "faults": [], "verdict": "pass", "problems": {}, "run_dir": None, "wall_s": 1.0},
            {**failing, "run_dir": str(tmp_path / "examples" / "002"), "wall_s": 2.0},
        ],
        "minimal": failing,
        "replay": f"testbed run {tmp_path / 'minimal.yaml'}",
    }
    html = drill_page(drill, tmp_path, "faults:\n  - kind: node_kill\n")
    assert f'<code id="replay">testbed run {tmp_path / "minimal.yaml"}</code>' in html
    assert '<pre id="minimal">faults:\n  - kind: node_kill\n</pre>' in html
    assert 'href="examples/002/report.html"' in html and "recovered: no" in html
    assert "2 schedule(s) drawn; 1 failed." in html
