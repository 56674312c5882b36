"""Preemption: a real SIGTERM, SIGKILL when the window runs out, and what the job does in between.

The checks are judged on hand-made journals (each fails on a bad one); the
library's preemption scenarios run on the session's Ray and come to their
declared verdicts for the stated reasons.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from testbed.core.errors import ScenarioError
from testbed.report.checks import run_checks
from testbed.report.preemption_checks import (
    check_preemption_commit,
    check_preemption_lost_work,
    check_preemption_no_partial,
    check_preemption_same_step,
)
from testbed.scenario.expect import Expect
from testbed.scenario.parse import parse_scenario

E = Expect()


def _notice(rank: int, t: float = 100.0, window: float = 30.0, on_notice: str = "save") -> dict[str, Any]:
    return {
        "event": "preempt_notice",
        "phase": "main",
        "rank": rank,
        "t": t,
        "deadline": t + window,
        "window_s": window,
        "on_notice": on_notice,
        "fault": "f0-preempt",
        "step": 6,
        "point": "forward",
    }


def journal(on_notice: str = "save") -> list[dict[str, Any]]:
    """A good cycle: a notice at t=100 (deadline 130), step 6 drained by 110, agreed by 111, its
    emergency checkpoint written in 10 s and committed at 121; ranks 2 and 3 leave, resume from 6."""
    ranks = {"0": 6, "1": 6, "2": 6, "3": 6}
    return [
        {
            "event": "checkpoint_committed",
            "phase": "main",
            "step": 4,
            "t": 80.0,
            "ranks": {r: ["params"] for r in ranks},
        },
        _notice(2, on_notice=on_notice),
        _notice(3, on_notice=on_notice),
        {
            "event": "preempt_agreed",
            "phase": "main",
            "step": 6,
            "ranks": ranks,
            "noticed": [2, 3],
            "t_notice": 100.0,
            "t_drained": 110.0,
            "t": 111.0,
            "deadline": 130.0,
        },
        {
            "event": "checkpoint_committed",
            "phase": "main",
            "step": 6,
            "t": 121.0,
            "write_s": 10.0,
            "ranks": {r: ["params"] for r in ranks},
        },
        {
            "event": "failure_detected",
            "phase": "main",
            "step": 7,
            "dead": [2, 3],
            "t_death": 121.0,
            "t": 121.0,
        },
        {"event": "resume", "phase": "main", "from_step": 6, "t": 160.0},
    ]


def unsaved(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` without an agreement or an emergency checkpoint (the grace ran out first)."""
    return [
        e
        for e in events
        if e["event"] != "preempt_agreed" and not (e["event"] == "checkpoint_committed" and e["step"] == 6)
    ]


def _with(events: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(events)
    for e in out:
        if e["event"] == event and (event != "checkpoint_committed" or e["step"] == 6):
            e.update(fields)
    return out


def test_a_good_cycle_passes_every_preemption_check_with_the_time_split() -> None:
    events = journal()
    results = {r.name: r for r in run_checks(events, E)}
    for name in (
        "preemption_commit",
        "preemption_same_step",
        "preemption_lost_work",
        "preemption_no_partial",
    ):
        assert results[name].status == "pass", results[name]
    (split,) = results["preemption_commit"].evidence["cycles"]
    assert split["drain_s"] == 10.0 and split["agree_s"] == 1.0 and split["write_s"] == 10.0
    assert split["commit_s"] == 0.0 and split["t_commit"] == 121.0


def test_a_journal_without_a_notice_runs_no_preemption_check() -> None:
    names = {r.name for r in run_checks(journal()[:1], E)}
    assert not any(n.startswith("preemption") for n in names)


def test_commit_fails_on_a_save_abandoned_past_the_deadline_and_names_the_overrun() -> None:
    events = [e for e in journal() if not (e["event"] == "checkpoint_committed" and e["step"] == 6)]
    abandoned = {
        "event": "checkpoint_unpublished",
        "phase": "main",
        "step": 6,
        "t_commit": 134.0,
        "deadline": 130.0,
        "write_s": 23.0,
    }
    events.insert(4, abandoned)
    result = check_preemption_commit(events, E)
    assert result.status == "fail" and "4.000 s past the deadline" in result.summary


def test_commit_fails_on_a_commit_after_the_deadline() -> None:
    result = check_preemption_commit(_with(journal(), "checkpoint_committed", t=131.0), E)
    assert result.status == "fail" and "after the deadline" in result.summary


def test_commit_fails_when_the_grace_ran_out_before_any_agreement() -> None:
    events = unsaved(journal())
    result = check_preemption_commit(events, E)
    assert result.status == "fail" and "before the ranks could agree" in result.summary


def test_same_step_fails_on_ranks_that_disagree_or_a_checkpoint_missing_one() -> None:
    split = _with(journal(), "preempt_agreed", ranks={"0": 6, "1": 6, "2": 5, "3": 6})
    assert check_preemption_same_step(split, E).status == "fail"
    short = _with(journal(), "checkpoint_committed", ranks={"0": [], "1": [], "2": []})
    result = check_preemption_same_step(short, E)
    assert result.status == "fail" and "not step 6 with every rank" in result.summary


def test_lost_work_fails_when_a_save_resumes_from_an_older_checkpoint() -> None:
    result = check_preemption_lost_work(_with(journal(), "resume", from_step=4), E)
    assert result.status == "fail" and "lost 2 step(s)" in result.summary


def test_lost_work_holds_abort_to_one_step_and_none_to_the_periodic_checkpoint() -> None:
    abort = _with(journal("abort"), "failure_detected", step=7)
    assert check_preemption_lost_work(abort, E).status == "pass"  # step 7 begun, resumed after 6
    assert check_preemption_lost_work(_with(abort, "resume", from_step=5), E).status == "fail"
    none = unsaved(journal("none"))
    none = _with(none, "failure_detected", step=9, t_death=130.0)
    none = _with(none, "resume", from_step=4)
    assert check_preemption_lost_work(none, E).status == "pass"  # back to step 4, committed before
    older = [{**none[0], "step": 2, "t": 50.0}, *none]
    assert check_preemption_lost_work(_with(older, "resume", from_step=2), E).status == "fail"


def test_no_partial_fails_on_a_commit_after_the_sigkill_or_a_resume_from_an_abandoned_save() -> None:
    late = _with(journal(), "checkpoint_committed", t=140.0)
    result = check_preemption_no_partial(late, E)
    assert result.status == "fail" and "after the SIGKILL" in result.summary
    events = [e for e in journal() if not (e["event"] == "checkpoint_committed" and e["step"] == 6)]
    events.insert(4, {"event": "checkpoint_unpublished", "phase": "main", "step": 6, "t_commit": 134.0})
    result = check_preemption_no_partial(events, E)
    assert result.status == "fail" and "whose save was never published" in result.summary


def test_checks_with_nothing_to_judge_say_unknown() -> None:
    open_cycle = journal()[:3]  # the notices came; the run ended before the deadline
    for check in (check_preemption_commit, check_preemption_same_step, check_preemption_lost_work):
        assert check(open_cycle, E).status == "unknown"


def test_a_run_that_ends_before_its_sigkill_says_the_notice_outlasts_it() -> None:
    last_step = {"event": "step_end", "phase": "main", "step": 8, "t": 104.0}
    open_cycle = [*journal()[:3], last_step]  # SIGKILL due at 130; the run ended at 104
    for check in (check_preemption_commit, check_preemption_lost_work):
        said = check(open_cycle, E)
        assert said.status == "unknown"
        assert "outlasts the run" in said.summary and "under 4 s" in said.summary
    late_end = {**last_step, "t": 131.0}  # the run went past the deadline: no such advice
    assert "outlasts" not in check_preemption_lost_work([*journal()[:3], late_end], E).summary


JOB = """\
version: 1
name: t
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 4}
workload: {name: mlp, steps: 32, parallel: {dp: 8}}
job: {model: llama3-8b, seq: 4096, global_batch: 256, micro_batch: 1}
policy:
  preemption: {notice_s: 120, grace_s: 120, launcher_timeout_s: 120}
faults:
  - {kind: preempt, target: {supernode: 1}, at: {step: STEP}}
"""


def test_a_notice_longer_than_the_rest_of_the_run_is_refused_by_the_jobs_step_time() -> None:
    parse_scenario(JOB.replace("STEP", "20"), "p.yaml")  # 13 steps of 22.6 s outlast 120 s
    with pytest.raises(ScenarioError) as info:
        parse_scenario(JOB.replace("STEP", "31"), "p.yaml")  # 2 steps: 45 s
    said = " ".join(info.value.problems)  # type: ignore[attr-defined]
    assert "p.yaml:9: faults[0]" in said and "outlast the rest of the run" in said
    assert "shorten notice_s/grace_s below 45.14 s" in said
    parse_scenario(JOB.replace("STEP}", "31}, grace_s: 40"), "p.yaml")  # a 40 s grace fits


BASE = """\
version: 1
name: t
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 20, parallel: {dp: 4}}
policy:
  checkpoint: {every: 5}
  preemption: {grace_s: 30}
faults:
  - {kind: preempt, target: {supernode: 1}, at: {step: 6, during: forward}, FIELD}
"""


@pytest.mark.parametrize(
    ("field", "needle"),
    [
        ("grace_s: 0", "grace_s must be a positive duration"),
        ("notice_s: -5", "notice_s must be a positive duration"),
        ("grace_s: soon", "grace_s must be a positive duration"),
    ],
    ids=["zero-grace", "negative-notice", "not-a-duration"],
)
def test_a_window_of_zero_or_less_is_refused_naming_the_field(field: str, needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BASE.replace("FIELD", field), "p.yaml")
    assert any(needle in p for p in info.value.problems)  # type: ignore[attr-defined]


def test_a_policy_grace_of_zero_and_an_unknown_on_notice_are_refused() -> None:
    text = BASE.replace(", FIELD", "").replace("{grace_s: 30}", "{grace_s: 0, on_notice: later}")
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "p.yaml")
    said = " ".join(info.value.problems)  # type: ignore[attr-defined]
    assert "grace_s" in said and "on_notice" in said and "save" in said


@pytest.mark.ray
@pytest.mark.parametrize(
    ("name", "verdict", "lost"),
    [
        ("preempt_spot_120s", "pass", 0),
        ("preempt_one_host_abort", "pass", 1),
        ("preempt_spot_30s", "fail", 6),
    ],
)
def test_the_library_preemptions_come_to_their_verdicts_for_their_reasons(
    testbed_runs: Any, name: str, verdict: str, lost: int
) -> None:
    import os

    from testbed.core.journal import read_journal
    from testbed.train import checkpoint as ckpt
    from tests.conftest import SCENARIOS

    report = testbed_runs(parse_scenario((SCENARIOS / f"{name}.yaml").read_text(), f"{name}.yaml"))
    assert report.verdict == verdict, report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    notices = [e for e in events if e["event"] == "preempt_notice"]
    assert notices and all(e["fault"] == "f0-preempt" for e in notices)
    (exit_,) = [e for e in events if e["event"] == "failure_detected" and e["phase"] == "main"]
    assert exit_["detected_by"] == "preemption" and sorted(exit_["dead"]) == sorted(
        e["rank"] for e in notices
    )
    for d in exit_["killed"]:  # the noticed processes are really gone
        assert d["gone"] and d["pid"] in {e["pid"] for e in notices}
        with pytest.raises(ProcessLookupError):
            os.kill(d["pid"], 0)
    (cycle,) = next(r for r in report.data["checks"] if r["name"] == "preemption_lost_work")["evidence"][
        "cycles"
    ]
    assert cycle["lost_steps"] == lost
    if verdict == "fail":
        (abandoned,) = [e for e in events if e["event"] == "checkpoint_unpublished"]
        assert abandoned["t_commit"] > abandoned["deadline"]
        assert not ckpt.step_dir(report.out_dir / "checkpoints", abandoned["step"]).exists()
        assert ckpt.step_dir(report.out_dir / "checkpoints", abandoned["step"], tmp=True).exists()


#: 4 NPUs on 2 hosts that restart in 10 s; each run below names itself and adds its policy and faults
NOTICED = """\
version: 1
name: NAME
seed: 5
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 10, parallel: {dp: 4}, hidden: 32}
policy:
  checkpoint: {every: 4}
  detection: {heartbeat_s: 5, missed: 3}
  recovery: {strategy: restart, max_restarts: 3, restart_s: 10}
POLICYsafeguards: {blast_radius_percent: 100}
faults:
"""

TWICE = NOTICED.replace("NAME", "noticed-twice").replace("POLICY", "") + (
    "  - {kind: preempt, target: {rank: 1}, at: {step: 3}, grace_s: 0.000040}\n"
    "  - {kind: preempt, target: {rank: 1}, at: {step: 4}, grace_s: 30}\n"
)


@pytest.mark.ray
def test_a_second_notice_to_a_noticed_rank_never_postpones_its_sigkill(testbed_runs: Any) -> None:
    from testbed.core.journal import read_journal

    report = testbed_runs(parse_scenario(TWICE, "twice.yaml"))
    events = read_journal(report.out_dir / "journal.jsonl")
    first, second = [e for e in events if e["event"] == "preempt_notice"]
    assert (first["rank"], second["rank"]) == (1, 1) and second.get("again") is True
    assert second["deadline"] == first["deadline"] < second["t"] + 30  # the first's SIGKILL stands
    (exit_,) = [e for e in events if e["event"] == "failure_detected" and e["phase"] == "main"]
    assert exit_["dead"] == [1]
    (kill,) = exit_["killed"]
    assert kill["point"] == "grace_end" and kill["gone"]
    assert report.verdict == "pass", report.data["checks"]


MID_LOAD = NOTICED.replace("NAME", "noticed-mid-load").replace(
    "POLICY", "  preemption: {notice_s: 120, grace_s: 120, launcher_timeout_s: 120, on_notice: save}\n"
) + (
    "  - {kind: node_kill, target: {rank: 3}, at: {step: 6, during: allreduce}}\n"
    "  - {kind: preempt, target: {rank: 1}, at: {step: 6, during: load}}\n"
)


@pytest.mark.ray
def test_a_notice_half_way_through_a_restarts_load_is_saved_and_the_rank_leaves(testbed_runs: Any) -> None:
    from testbed.core.journal import read_journal

    report = testbed_runs(parse_scenario(MID_LOAD, "mid-load.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    (notice,) = [e for e in events if e["event"] == "preempt_notice"]
    assert (notice["rank"], notice["point"], notice["step"]) == (1, "load.mid", 6)
    first, second = [e for e in events if e["event"] == "failure_detected" and e["phase"] == "main"]
    assert (first["dead"], first["detected_by"]) == ([3], "heartbeat")
    assert (second["dead"], second["detected_by"]) == ([1], "preemption")
    assert first["seq"] < notice["seq"] < second["seq"]  # in the restart after rank 3's death
    (row,) = [r for r in report.data["fault_table"] if r["what"] == "preempt"]
    assert row["effect"] == "SIGTERM to rank 1 mid-load of step 6"
