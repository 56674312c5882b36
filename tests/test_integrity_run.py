"""Silent data corruption on Ray: every library scenario tagged ``sdc`` comes to the verdict it
declares, for the reasons it gives; the same seed corrupts the same bits at the same virtual times;
clean runs raise no alarm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.core.journal import read_journal
from testbed.report.run_report import Report
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario, parse_scenario
from tests.conftest import SCENARIOS

pytestmark = [pytest.mark.ray, pytest.mark.slow]

Run = Callable[[Scenario], Report]
SDC = sorted(p for p in SCENARIOS.glob("*.yaml") if {"sdc"} == {"sdc", "drill"} & set(load_scenario(p).tags))


def journal(report: Report) -> list[dict[str, Any]]:
    return read_journal(report.out_dir / "journal.jsonl")


def of(events: list[dict[str, Any]], name: str, phase: str = "main") -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name and e.get("phase", phase) == phase]


def check(report: Report, name: str) -> dict[str, Any]:
    return next(c for c in report.data["checks"] if c["name"] == name)


def test_the_library_has_the_sdc_scenarios() -> None:
    names = {p.stem for p in SDC}
    assert {
        "sdc_mantissa_hash",
        "sdc_exponent_spike",
        "sdc_lemon_three_strikes",
        "sdc_poisoned_checkpoint_avoided",
        "sdc_two_replicas",
    } <= names


@pytest.mark.parametrize("path", SDC, ids=lambda p: p.stem)
def test_each_sdc_scenario_comes_to_its_declared_verdict(testbed_runs: Run, path: Path) -> None:
    report = testbed_runs(load_scenario(path))
    declared = report.data["declared"]
    assert declared["as_declared"], declared["why"]
    events = journal(report)
    effects = next(e for e in events if e["event"] == "fault_effects")["effects"]
    assert all(e["took"] for e in effects.values()), effects  # every corruption struck
    found, resumes = of(events, "sdc_detected"), of(events, "resume")
    name = path.stem
    if name == "sdc_mantissa_hash":
        assert [(d["step"], d["detector"], d["ranks"]) for d in found] == [(8, "parameter_hash", [2])]
        assert [(r["from_step"], r["verified"]) for r in resumes] == [(4, True)]
    elif name == "sdc_exponent_spike":
        assert [(d["step"], d["detector"], d["ranks"]) for d in found] == [(5, "validator", [1])]
        assert "x the median" in found[0]["reason"] or "inf" in found[0]["reason"]
    elif name == "sdc_lemon_three_strikes":
        assert [d["ranks"] for d in found] == [[1], [1], [1]]
        (excluded,) = of(events, "npu_excluded")
        (replaced,) = of(events, "npu_replaced")
        assert (
            excluded["ranks"] == [1] and replaced["rank"] == 1 and replaced["new_pid"] != replaced["old_pid"]
        )
    elif name == "sdc_poisoned_checkpoint_avoided":
        assert [r["from_step"] for r in resumes] == [4]
        assert of(events, "checkpoint_abandoned")[0]["steps"] == [6]
    elif name == "sdc_poisoned_checkpoint_restored":
        assert report.verdict == "aborted" and resumes[0]["from_step"] == 6
        assert "written after the corruption of step 6" in check(report, "no_poisoned_resume")["summary"]
    elif name == "sdc_two_replicas":
        assert [d["ranks"] for d in found] == [[]]
        assert "cannot be told" in found[0]["reason"]
    elif name == "sdc_replay_transient":
        replays = of(events, "sdc_replay")
        assert [(r["step"], r["verdict"], r["ranks"]) for r in replays] == [(5, "transient", [1])]
        assert resumes == []  # the replay's result was kept: no checkpoint loaded
    elif name == "sdc_replay_lemon":
        replays = of(events, "sdc_replay")
        assert [(r["step"], r["verdict"]) for r in replays] == [
            (5, "persistent"),
            (6, "persistent"),
            (7, "persistent"),
        ]
        assert of(events, "npu_excluded")[0]["ranks"] == [2]
    elif name == "sdc_payload_unchecked":
        assert found == [] and check(report, "sdc_detected")["status"] == "fail"
        hits = [h for e in of(events, "step_end") for h in e.get("sdc", {}).get("2", [])]
        assert [h["tensor"] for h in hits] == ["payload 1->2"] and not hits[0].get("caught")
    elif name == "sdc_payload_checksum":
        assert [(d["step"], d["detector"], d["links"], d["cured"]) for d in found] == [
            (4, "payload_checksum", [[1, 2]], True),
            (7, "payload_checksum", [[2, 3]], True),
        ]
        caught = [h for e in of(events, "step_end") for hs in e.get("sdc", {}).values() for h in hs]
        assert len(caught) == 2 and all(h["caught"] for h in caught) and resumes == []
    elif name == "sdc_activation_forward":
        assert [(d["step"], d["detector"], d["ranks"]) for d in found] == [(5, "validator", [2])]
        (hit,) = of(events, "step_end")[4]["sdc"]["2"]
        assert hit["where"] == "activation" and hit["tensor"] == "layer 0" and hit["bits"] == [30]
        assert [r["from_step"] for r in resumes] == [4]
    elif name == "sdc_index_crash":
        (failure,) = of(events, "failure_detected")
        (hit,) = failure["errors"]["1"]["sdc"]
        assert failure["step"] == 6 and failure["detected_by"] == "device_fault"
        assert failure["errors"]["1"]["error"] == "DeviceFault" and hit["after"] - hit["before"] == 2**40
        assert "gather of samples failed" in failure["errors"]["1"]["message"]
        assert [r["from_step"] for r in resumes] == [4] and found == []
        row = check(report, "sdc_detected")["evidence"]["corruptions"][0]
        assert (row["detector"], row["latency"]) == ("device_fault", 0)
    elif name == "sdc_optimizer_state":
        assert [(d["step"], d["detector"], d["ranks"]) for d in found] == [(8, "parameter_hash", [3])]
        hits = of(events, "step_end")[5]["sdc"]["3"]
        assert len(hits) == 4 and {h["where"] for h in hits} == {"optimizer"}
        assert all(h["tensor"].startswith(("m.", "v.")) for h in hits)
        assert [r["from_step"] for r in resumes] == [4]
    elif name == "sdc_skip_batches":
        assert [(r["from_step"], r["skips_batches"]) for r in resumes] == [(4, 2)]
        skips = [(e["phase"], e["step"], e["batches"]) for e in events if e["event"] == "batches_skipped"]
        assert skips == [("main", 5, 2), ("reference", 5, 2)]
        (ckpt8,) = [e for e in of(events, "checkpoint_committed") if e["step"] == 8]
        assert ckpt8["audit"]["0"]["cursor"] == [0, (8 + 2) * 32]  # ten batches drawn by step 8
        assert (
            "which skipped the same batches: 2 before step 5"
            in check(report, "matches_uninterrupted")["summary"]
        )
    elif name == "sdc_silent_mantissa":
        assert found == [] and check(report, "sdc_detected")["status"] == "fail"
        assert check(report, "matches_uninterrupted")["status"] == "fail"
    if report.verdict == "pass":  # the rollback left a run equal to an uninterrupted one
        ends = {e["phase"]: e["digest"] for e in events if e["event"] == "phase_end"}
        assert ends["main"] == ends["reference"]


def _figures(report: Report) -> list[Any]:
    """What the seed decides: each step's virtual times and digest, each corruption, each detection."""
    events = journal(report)
    return [
        (e["event"], e.get("step"), e.get("t"), e.get("digest"), e.get("sdc"), e.get("ranks"))
        for e in events
        if e["event"] in ("step_end", "sdc_detected", "integrity_check", "resume", "phase_end")
    ]


def test_the_same_seed_gives_the_same_corruption_detection_and_parameters(testbed_runs: Run) -> None:
    scenario = load_scenario(SCENARIOS / "sdc_lemon_three_strikes.yaml")
    first, again = testbed_runs(scenario), testbed_runs(scenario)
    assert _figures(first) == _figures(again)
    assert first.data["final_digest"] == again.data["final_digest"]


CLEAN = """\
version: 1
name: sdc_clean
seed: {seed}
cluster: {{preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 8}}
workload: {{name: transformer, steps: 16, parallel: {{dp: 4, tp: 2}}}}
policy:
  checkpoint: {{every: 4}}
  integrity:
    validators: {{spike_factor: 10, window: 5}}
    hash: {{every: 2}}
    strikes: {{count: 3, window: 50}}
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_clean_runs_raise_no_alarm_and_exclude_no_one(testbed_runs: Run, seed: int) -> None:
    report = testbed_runs(parse_scenario(CLEAN.format(seed=seed), "clean.yaml"))
    events = journal(report)
    assert report.verdict == "pass", report.data["checks"]
    assert of(events, "sdc_detected") == [] and of(events, "npu_excluded") == []
    checks = of(events, "integrity_check")
    assert len(checks) == 16 and sum("parameter_hash" in c["detectors"] for c in checks) == 8
    assert all(c["hash_agrees"] for c in checks if "parameter_hash" in c["detectors"])
    assert check(report, "sdc_false_alarms")["evidence"]["per_1000_steps"] == 0.0
    assert report.data["goodput"]["integrity_s"] > 0  # the detectors' reads were charged


@pytest.mark.usefixtures("ray_session")
def test_the_sdc_sweep_shows_each_detector_missing_what_the_other_catches(tmp_path: Path) -> None:
    from testbed.experiments.sdc_sweep import sdc_sweep

    shapes = ["gradient-exponent", "params-mantissa", "gradient-bias", "payload-mantissa"]
    summary = sdc_sweep(
        SCENARIOS / "sdc_mantissa_hash.yaml", tmp_path, shapes, ["validators", "hash", "checksums"], [4]
    )
    rows = {r["config"]: r for r in summary["rows"]}
    assert set(rows) == {"validators", "hash every 4", "checksums"}
    # a spike in a gradient before the reduction leaves the replicas equal: only the validators see it;
    # a mantissa flip in memory leaves the norms ordinary: only the hash sees it; a 1e-3 bias in a
    # gradient, neither (every replica applies the same update and the norm moves by a thousandth)
    assert rows["validators"]["missed"] == ["params-mantissa", "gradient-bias", "payload-mantissa"]
    assert rows["hash every 4"]["missed"] == ["gradient-exponent", "gradient-bias"]
    # a payload corrupted on its link is the checksums' to catch, and nothing else is
    assert rows["checksums"]["missed"] == ["gradient-exponent", "params-mantissa", "gradient-bias"]
    assert rows["checksums"]["rollback_mean"] == 0 and rows["checksums"]["equal"] == "1/4"  # sent again
    assert all(r["not_struck"] == [] for r in rows.values())
    assert rows["validators"]["latency_max"] == 0 and rows["hash every 4"]["latency_max"] <= 4
    assert all(r["false_alarms_per_1000"] == 0 for r in rows.values())
    # measured against the clean run with no detector: the reads and the checksums cost virtual time
    assert rows["validators"]["overhead"] > 0 and rows["checksums"]["overhead"] > 0
    assert rows["hash every 4"]["overhead"] >= 0
    table = (tmp_path / "sdc_sweep.md").read_text()
    assert "| checksums | 1/4 |" in table


@pytest.mark.usefixtures("ray_session")
def test_a_drill_finds_a_corruption_shape_the_detectors_cannot_see(tmp_path: Path) -> None:
    from testbed.testing.drill import run_drill

    base = load_scenario(SCENARIOS / "drill_sdc.yaml")
    kinds = ("sdc_gradient", "sdc_params")
    result = run_drill(base, seed=1, budget_s=8, out_dir=tmp_path / "drill", max_faults=1, kinds=kinds)
    assert result.minimal is not None and result.exit_code == 1
    (fault,) = result.minimal.faults
    assert fault["kind"] in kinds
    # the corruption went unseen, or was seen too late to undo: the run ends unlike an uninterrupted one
    said = " ".join(result.minimal.problems["expect"])
    assert "matches_uninterrupted" in said or "sdc_detected" in said


REPLAYED = CLEAN.replace("    hash: {{every: 2}}\n", "").replace(
    "validators: {{spike_factor: 10, window: 5}}",
    "validators: {{spike_factor: 1, window: 5}}\n    replay: {{}}\n    restore: newest",
)


def test_a_replay_of_a_healthy_step_calls_it_correct_strikes_no_one_and_keeps_the_run_exact(
    testbed_runs: Run,
) -> None:
    # a spike factor of 1 makes healthy steps suspect: every replay must find the result correct
    report = testbed_runs(parse_scenario(REPLAYED.format(seed=3), "replayed.yaml"))
    events = journal(report)
    replays = of(events, "sdc_replay")
    assert (
        replays and {r["verdict"] for r in replays} == {"correct"} and all(r["ranks"] == [] for r in replays)
    )
    assert of(events, "npu_excluded") == [] and of(events, "resume") == []
    assert check(report, "sdc_false_alarms")["status"] == "fail"  # each suspicion was a false alarm
    ends = {e["phase"]: e["digest"] for e in events if e["event"] == "phase_end"}
    assert ends["main"] == ends["reference"]
