"""The scenario library as a regression suite: declared verdicts, tags, the table and the JUnit file."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.core.errors import ScenarioError
from testbed.report.checks import declared
from testbed.scenario.expect import Expect
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.testing import suite
from tests.conftest import SCENARIOS

#: the library scenarios that demonstrate a wrong policy, and the checks each must fail
MEANT_TO_FAIL = {
    "incomplete_checkpoint": ("fail", {"checkpoint_complete", "matches_uninterrupted"}),
    "scheduler_dropped": ("fail", {"checkpoint_complete", "matches_uninterrupted"}),
    "memory_fragmentation_none": ("aborted", {"recovered", "failures"}),
    "unsupported_op": ("fail", {"recovered"}),
    "version_mismatch": ("fail", {"recovered"}),
    "timeout_tuning": ("fail", {"recovered"}),
    "serving_kv_pressure_uncapped": ("fail", {"lost_requests"}),
    "sdc_silent_mantissa": ("fail", {"matches_uninterrupted", "sdc_detected"}),
    "sdc_poisoned_checkpoint_restored": ("aborted", {"recovered", "no_poisoned_resume"}),
    "sdc_payload_unchecked": ("fail", {"matches_uninterrupted", "sdc_detected"}),
    "preempt_spot_30s": ("fail", {"preemption_commit", "preemption_lost_work"}),
    "preempt_storm": ("aborted", {"recovered", "preemption_commit", "preemption_lost_work"}),
}


def _checks(
    failed: list[str], names: tuple[str, ...] = ("recovered", "checkpoint_complete", "goodput")
) -> list:
    return [{"name": n, "status": "fail" if n in failed else "pass"} for n in names]


def test_the_library_declares_what_each_scenario_demonstrates() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        s = load_scenario(path)
        want = MEANT_TO_FAIL.get(path.stem, ("pass", set()))
        assert (s.expect.verdict, set(s.expect.fails)) == want, path.name
        assert s.tags and ({"fast", "slow"} & set(s.tags)), f"{path.name} has no speed tag"
    smoke = [p.stem for p in sorted(SCENARIOS.glob("*.yaml")) if "smoke" in load_scenario(p).tags]
    assert "quickstart" in smoke and any(name in MEANT_TO_FAIL for name in smoke)


def test_a_run_is_as_declared_only_with_the_verdict_and_exactly_the_checks_named() -> None:
    meant = Expect(verdict="fail", fails=("checkpoint_complete",))
    assert declared(meant, "fail", _checks(["checkpoint_complete"]))["as_declared"]
    passed = declared(meant, "pass", _checks([]))
    assert not passed["as_declared"] and "verdict is pass, the scenario declares fail" in passed["why"]
    wrong = declared(meant, "fail", _checks(["goodput"]))
    assert not wrong["as_declared"]
    assert "checkpoint_complete did not fail" in wrong["why"] and "goodput failed too" in wrong["why"]
    extra = declared(meant, "fail", _checks(["checkpoint_complete", "recovered"]))
    assert not extra["as_declared"] and "recovered failed too" in extra["why"]
    aborted = declared(Expect(verdict="aborted"), "aborted", _checks(["recovered"]))
    assert aborted["as_declared"]
    healthy = declared(Expect(), "fail", _checks(["recovered"]))
    assert not healthy["as_declared"] and "(failed: recovered)" in healthy["why"]
    assert declared(Expect(), "pass", _checks([]))["as_declared"]


def test_the_checks_a_scenario_may_name_are_the_checks_the_harness_runs() -> None:
    from testbed.core.registry import CHECKS
    from testbed.report.checks import run_checks

    training = [r.name for r in run_checks([], Expect())]
    serving = [r.name for r in run_checks([{"event": "serve_start"}], Expect())]
    integrity = [r.name for r in run_checks([{"event": "integrity"}], Expect())]
    notice = {"event": "preempt_notice", "phase": "main", "on_notice": "save", "deadline": 1.0, "t": 0.0}
    preemption = [r.name for r in run_checks([notice], Expect())]
    cut = {"event": "fault_injected", "kind": "partition", "id": "f0", "params": {"cuts_control": True}}
    partition = [r.name for r in run_checks([cut], Expect())]
    assert sorted(CHECKS) == sorted({*training, *serving, *integrity, *preemption, *partition})
    assert partition[len(training) :] == ["one_history", "heal_progress", "zombies_fenced"]
    assert preemption[len(training) :] == [
        "preemption_commit",
        "preemption_same_step",
        "preemption_lost_work",
        "preemption_no_partial",
    ]
    assert integrity[len(training) :] == [
        "sdc_detected",
        "sdc_attribution",
        "sdc_false_alarms",
        "no_poisoned_resume",
    ]
    assert training[:3] == ["recovered", "recovery_time", "checkpoint_complete"]
    assert serving == [
        "lost_requests",
        "serving_latency",
        "slo_attainment",
        "tokens_identical",
        "serving_faults",
        "colocation",
        "autoscaling",
    ]


def test_declared_verdicts_and_tags_parse_and_default() -> None:
    base = (SCENARIOS / "drill.yaml").read_text()
    s = parse_scenario(base, "d.yaml")
    assert s.expect.verdict == "pass" and s.expect.fails == ()
    text = base.replace("tags: [fast, drill]", "tags: [smoke, fast, smoke]").replace(
        "expect:\n", "expect:\n  fails: [recovered, goodput]\n"
    )
    s = parse_scenario(text, "d.yaml")
    assert s.expect.verdict == "fail" and s.expect.fails == ("recovered", "goodput")
    assert s.tags == ("smoke", "fast")
    aborted = parse_scenario(base.replace("expect:\n", "expect:\n  verdict: aborted\n"), "d.yaml")
    assert aborted.expect.verdict == "aborted" and aborted.expect.fails == ()


def test_scenario_files_take_folders_and_files_each_once_in_order(tmp_path: Path) -> None:
    files = suite.scenario_files([SCENARIOS / "quickstart.yaml", SCENARIOS, SCENARIOS / "drill.yaml"])
    assert files[0].name == "quickstart.yaml" and len(files) == len({f.resolve() for f in files})
    assert len(files) == len(list(SCENARIOS.glob("*.yaml")))
    with pytest.raises(ScenarioError, match="no such scenario file or folder"):
        suite.scenario_files([tmp_path / "nope"])
    with pytest.raises(ScenarioError, match="no scenario files"):
        suite.scenario_files([tmp_path])


def test_every_invalid_file_of_a_suite_is_reported_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("version: 2\n")
    (tmp_path / "b.yaml").write_text((SCENARIOS / "drill.yaml").read_text().replace("steps: 12", "steps: 0"))
    (tmp_path / "c.yaml").write_text((SCENARIOS / "drill.yaml").read_text())
    with pytest.raises(ScenarioError) as err:
        suite.load_suite(suite.scenario_files([tmp_path]))
    text = str(err.value)
    assert text.startswith("2 of 3 scenario file(s) are invalid") and "a.yaml:1" in text and "b.yaml:" in text


def test_tags_choose_scenarios_and_an_unknown_tag_names_the_tags_in_use() -> None:
    scenarios = suite.load_suite(suite.scenario_files([SCENARIOS]))
    smoke = suite.with_tags(scenarios, ["smoke"])
    assert smoke and all("smoke" in s.tags for s in smoke) and len(smoke) < len(scenarios)
    assert suite.with_tags(scenarios, []) == scenarios
    with pytest.raises(ScenarioError, match=r"the tags in use are .*smoke"):
        suite.with_tags(scenarios, ["nightly-only"])


def _row(name: str, ok: bool, why: str = "") -> suite.SuiteRow:
    return suite.SuiteRow(
        name,
        f"{name}.yaml",
        ("fast",),
        "pass",
        "fail (recovered)",
        ("recovered",),
        ok,
        why,
        1,
        2.0,
        f"runs/{name}",
    )


def test_the_table_and_junit_name_what_was_not_as_declared(tmp_path: Path) -> None:
    rows = [_row("good", True), _row("bad", False, "the run's verdict is pass, the scenario declares fail")]
    text = suite.table(rows)
    assert "1 of 2 scenario(s) came to what they declare" in text
    assert "bad (bad.yaml): the run's verdict is pass, the scenario declares fail; see runs/bad" in text
    junit = suite.write(rows, tmp_path, tmp_path / "ci" / "suite.xml")
    root = ET.parse(junit).getroot()
    assert root.get("tests") == "2" and root.get("failures") == "1"
    (failure,) = root.iter("failure")
    assert "declares fail" in str(failure.get("message"))
    assert json.loads((tmp_path / "suite.json").read_text())[1]["as_declared"] is False
    assert suite.exit_code(rows) == 1 and suite.exit_code(rows[:1]) == 0


def test_an_invalid_suite_exits_254_naming_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text("version: 1\nname: a\ntags: [Bad Tag]\n")
    assert main(["suite", str(tmp_path), "--out", str(tmp_path / "out")]) == 254
    err = capsys.readouterr().err
    assert "a.yaml:3: tags" in err and "nothing was started" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_meant_to_fail_scenario_that_passes_fails_the_suite_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meant = (SCENARIOS / "version_mismatch.yaml").read_text()
    healed = (
        meant.replace("name: version-mismatch", "name: version-mismatch-healed")
        .replace("version: HCCL 7.0.0", "version: HCCL 8.0.RC3")  # the same stack everywhere
        .replace("version: 1\n", "version: 1\npolicy: {checkpoint: {every: 5}}\n")  # a checkpoint to prove
    )
    (tmp_path / "meant.yaml").write_text(meant)
    (tmp_path / "healed.yaml").write_text(healed)
    out = tmp_path / "out"
    code = main(["suite", str(tmp_path / "meant.yaml"), str(tmp_path / "healed.yaml"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert "1 of 2 scenario(s) came to what they declare" in printed
    assert (
        "version-mismatch-healed (" in printed
        and "the run's verdict is pass, the scenario declares fail" in printed
    )
    root = ET.parse(out / "junit.xml").getroot()
    assert [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None] == [
        "version-mismatch-healed"
    ]
    assert (out / "meant" / "journal.jsonl").is_file() and (out / "healed" / "report.json").is_file()
