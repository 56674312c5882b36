"""The controller lost for real, and ``testbed resume``: refusals that change nothing, a torn journal,
and the library's kill mid-commit resumed bit for bit."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.control.controller_loss import ArmedKill, die_if_armed
from testbed.control.resume import SCENARIO_COPY, interrupted, resumed_journal, version
from testbed.core.errors import ScenarioError, TestbedError
from testbed.core.journal import Journal, read_journal
from testbed.scenario.parse import load_scenario, parse_scenario
from tests.conftest import SCENARIOS

LIBRARY = SCENARIOS / "controller_killed_mid_commit.yaml"


def _event(seq: int, event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "run": "r1", "seq": seq, **fields}) + "\n"


def killed_run(folder: Path, **start: Any) -> Path:
    """A run folder as a killed controller leaves it: the scenario's copy, a journal that stops at
    the kill (``start`` changes its run_start)."""
    folder.mkdir(parents=True, exist_ok=True)
    scenario = load_scenario(LIBRARY)
    (folder / SCENARIO_COPY).write_text(LIBRARY.read_text())
    fields = {
        "scenario": scenario.name,
        "file": str(LIBRARY),
        "seed": scenario.seed,
        "scenario_sha256": scenario.digest(),
        "testbed_version": version(),
    } | start
    (folder / "journal.jsonl").write_text(
        _event(1, "run_start", **fields)
        + _event(2, "phase_start", phase="main", first_step=1)
        + _event(3, "step_end", phase="main", step=1, t=5.0)
        + _event(4, "controller_killed", fault="f0-controller_kill", point="step.start", t=5.5)
    )
    return folder


def _fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _ended(folder: Path) -> None:
    with open(folder / "journal.jsonl", "a") as f:
        f.write(_event(5, "run_end"))


def _main_ended(folder: Path) -> None:
    with open(folder / "journal.jsonl", "a") as f:
        f.write(_event(5, "phase_end", phase="main", t=9.0))


def _no_start(folder: Path) -> None:
    lines = (folder / "journal.jsonl").read_text().splitlines(keepends=True)
    (folder / "journal.jsonl").write_text("".join(lines[1:]))


REFUSALS = [
    ("not-a-run", lambda f: (f / "journal.jsonl").unlink(), "not a run: it holds no journal.jsonl"),
    ("no-run-start", _no_start, "does not begin with run_start"),
    ("ended", _ended, "this run ended"),
    ("main-ended", _main_ended, "its main phase ended"),
    ("other-version", None, "it was run by testbed 0.0.1"),
    ("other-scenario", None, "it is a run of another scenario"),
    (
        "copy-edited",
        lambda f: (f / SCENARIO_COPY).write_text(LIBRARY.read_text().replace("steps: 12", "steps: 16")),
        "another scenario",
    ),
    ("no-copy", lambda f: (f / SCENARIO_COPY).unlink(), "holds no scenario.yaml"),
]


@pytest.mark.parametrize(("case", "spoil", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_resume_refuses_what_it_cannot_go_on_with_and_changes_nothing(
    tmp_path: Path, case: str, spoil: Any, needle: str
) -> None:
    start = {"testbed_version": "0.0.1"} if case == "other-version" else {}
    if case == "other-scenario":
        start = {"scenario_sha256": "0" * 64}
    folder = killed_run(tmp_path / "run", **start)
    if spoil is not None:
        spoil(folder)
    before = _fingerprint(folder)
    with pytest.raises(ScenarioError) as info:
        interrupted(folder)
    assert needle in str(info.value) and "Nothing in the folder was changed" in str(info.value)
    assert main(["resume", str(folder)]) == 254
    assert _fingerprint(folder) == before


def test_a_resume_refuses_a_missing_folder_and_another_scenario_given_by_file(tmp_path: Path) -> None:
    assert main(["resume", str(tmp_path / "nowhere")]) == 254
    folder = killed_run(tmp_path / "run")
    before = _fingerprint(folder)
    assert main(["resume", str(folder), "--scenario", str(SCENARIOS / "quickstart.yaml")]) == 254
    assert _fingerprint(folder) == before
    assert interrupted(folder, load_scenario(LIBRARY)).scenario.name == "controller_killed_mid_commit"


def test_a_torn_last_line_is_dropped_and_the_numbering_goes_on(tmp_path: Path) -> None:
    folder = killed_run(tmp_path / "run")
    with open(folder / "journal.jsonl", "a") as f:
        f.write('{"event": "step_e')  # the kill came in the middle of a write
    found = interrupted(folder)
    assert found.torn_bytes == len('{"event": "step_e') and found.t_lost == 5.5
    journal = resumed_journal(found)
    journal.emit("phase_start", phase="main")
    journal.close()
    events = read_journal(folder / "journal.jsonl")
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[4]["event"] == "controller_resumed" and events[4]["torn_bytes"] == 17
    assert (folder / "journal.jsonl").read_text().endswith("\n")


def test_a_journal_can_tear_its_last_line_as_a_kill_mid_write_does(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", "r1")
    journal.emit("run_start")
    journal.tear()
    journal.close()
    text = (tmp_path / "j.jsonl").read_text()
    assert not text.endswith("\n") and [e["event"] for e in read_journal(tmp_path / "j.jsonl")] == [
        "run_start"
    ]


def test_a_process_that_does_not_host_a_run_never_kills_itself(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", "r1")
    die_if_armed(None, journal, "step.start", 1.0)  # nothing armed: nothing happens
    die_if_armed(ArmedKill("f0", "manifest.written"), journal, "step.start", 1.0)  # another point
    with pytest.raises(TestbedError, match="does not host the run"):
        die_if_armed(ArmedKill("f0", "step.start"), journal, "step.start", 1.0)
    assert os.getpid() > 0 and journal.events == []


BASE = """\
version: 1
name: t
cluster: {preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: 2}
workload: {name: mlp, steps: 8, parallel: {dp: 2}}
policy: {checkpoint: {every: 4}}
faults:
  - {kind: controller_kill, ENTRY}
"""


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("target: {rank: 0}, at: {step: 2}", "controller_kill has no target"),
        ("at: {step: 2}, torn: maybe", "torn must be true or false"),
        ("at: {step: 9}", "N in 1..8"),
        ("at: {step: 6, during: forward}", "not a point controller_kill knows"),
    ],
)
def test_a_bad_controller_kill_is_refused_naming_the_field(entry: str, needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BASE.replace("ENTRY", entry), "k.yaml")
    assert any(needle in p for p in info.value.problems)  # type: ignore[attr-defined]


@pytest.mark.ray
def test_the_controller_killed_mid_commit_is_resumed_bit_for_bit(testbed_runs: Any) -> None:
    report = testbed_runs(load_scenario(LIBRARY))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    names = [e["event"] for e in events]
    (killed,) = [e for e in events if e["event"] == "controller_killed"]
    assert killed["point"] == "manifest.written" and killed["checkpoint"] == 8
    with pytest.raises(ProcessLookupError):  # the controller's process is really gone
        os.kill(int(killed["pid"]), 0)
    (resumed,) = [e for e in events if e["event"] == "controller_resumed"]
    assert (
        resumed["torn_bytes"] > 0
        and names.index("controller_resumed") == names.index("controller_killed") + 1
    )
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["detected_by"] == "controller" and failure["t_death"] == killed["t"]
    (back,) = [e for e in events if e["event"] == "resume" and e["phase"] == "main"]
    assert back["from_step"] == 4  # step 8's checkpoint was never renamed into place
    assert names.count("run_start") == 1 and names.count("run_end") == 1
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {c["name"]: c["status"] for c in report.data["checks"]}["matches_uninterrupted"] == "pass"


@pytest.mark.ray
def test_a_run_whose_controller_dies_twice_is_resumed_twice(testbed_runs: Any) -> None:
    text = BASE.replace(  # mid-step 2 (the ranks at work), then mid-commit of step 4's checkpoint
        "ENTRY", "at: {step: 2, during: step}}\n  - {kind: controller_kill, at: {step: 4, during: checkpoint}"
    )
    text = text.replace("policy: {", "policy: {detection: {heartbeat_s: 5, missed: 3}, ")
    report = testbed_runs(parse_scenario(text, "twice.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    killed = [e for e in events if e["event"] == "controller_killed"]
    assert [(e["fault"], e["point"]) for e in killed] == [
        ("f0-controller_kill", "step.running"),
        ("f1-controller_kill", "manifest.written"),
    ]
    first = events.index(killed[0])
    assert (
        killed[0]["step"] == 2
        and not any(  # the step was in flight: its end never journalled
            e["event"] == "step_end" and e["step"] == 2 for e in events[:first]
        )
    )
    assert len({e["pid"] for e in killed}) == 2  # two controller processes, each really killed
    assert [e["from_step"] for e in events if e["event"] == "resume" and e["phase"] == "main"] == [0, 0]
    assert sum(e["event"] == "controller_resumed" for e in events) == 2


@pytest.mark.ray
def test_the_controller_killed_mid_recovery_is_resumed_and_each_fault_keeps_its_row(
    testbed_runs: Any,
) -> None:
    report = testbed_runs(load_scenario(SCENARIOS / "controller_killed_mid_recovery.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    (killed,) = [e for e in events if e["event"] == "controller_killed"]
    first = next(e for e in events if e["event"] == "failure_detected")
    assert killed["point"] == "recovery.relinked" and first["detected_by"] == "heartbeat"
    assert killed["t"] > first["t"]  # in the recovery, after the node loss was detected
    (back,) = [e for e in events if e["event"] == "resume" and e["phase"] == "main"]
    assert back["from_step"] == 8 and not any(
        e["event"] == "resume" and e["seq"] < killed["seq"] for e in events
    )  # the first recovery never loaded
    rows = {r["what"]: r for r in report.data["fault_table"]}
    assert rows["node_kill"]["recovered"] == "cut short by the controller's loss"
    assert (
        rows["controller_kill"]["detected"].startswith("controller")
        and rows["controller_kill"]["took_effect"]
    )


def test_a_resume_rearms_a_poisson_process_past_the_arrivals_that_fired() -> None:
    from faults.arrivals import Arrivals
    from testbed.control.in_force import rearmed
    from testbed.scenario.plan import make_plan

    poisson = "{kind: node_kill, target: {mode: one}, at: {mtbf: 60}}"
    text = BASE.replace("{kind: controller_kill, ENTRY}", poisson)
    scenario = parse_scenario(text, "mtbf.yaml")
    (fault,) = make_plan(scenario)
    fresh = Arrivals.start(fault, scenario.seed)
    drawn = [a for _ in range(4) for a in fresh.due(fresh.next_t, 0)]
    prior = [{"event": "fault_injected", "id": a.id} for a in drawn[:2]]
    (process,) = rearmed([fault], scenario.seed, prior)
    again = [a for _ in range(2) for a in process.due(process.next_t, 0)]
    assert [(a.id, a.params["t_arrival"], a.params["ranks"]) for a in again] == [
        (a.id, a.params["t_arrival"], a.params["ranks"]) for a in drawn[2:]
    ]


@pytest.mark.ray
def test_a_fault_in_force_when_the_controller_died_is_put_back_until_its_end(testbed_runs: Any) -> None:
    entry = "at: {step: 5}}\n  - {kind: link_degrade, target: {link: [0, 1]}, at: {step: 2}, duration: 1000"
    report = testbed_runs(parse_scenario(BASE.replace("ENTRY", entry), "in-force.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    names = [e["event"] for e in events]
    (restored,) = [e for e in events if e["event"] == "fault_restored"]
    assert restored["id"] == "f1-link_degrade" and restored["until"] is not None
    assert names.index("controller_resumed") < names.index("fault_restored")
    after = events[names.index("fault_restored") :]
    hits = [e for e in after if e["event"] == "fault_hits"]
    assert any(e["hits"].get("f1-link_degrade", 0) > 0 for e in hits)  # it slows messages again
