"""Each harness check passes on a good journal and fails on a bad one (pure functions of events)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.report.checks import run_checks, verdict
from testbed.report.goodput import goodput
from testbed.scenario.expect import Expect

Events = list[dict[str, Any]]
ALL = ["params", "optimizer", "lr_scheduler", "rng", "data_cursor"]


def good_journal() -> Events:
    """A run killed at step 5, restarted from the step-4 checkpoint, matching its reference."""
    ev: Events = [{"event": "workload", "components": ALL}]
    ev += [{"event": "step_end", "phase": "main", "step": s, "digest": f"d{s}"} for s in range(1, 5)]
    ev.append(
        {
            "event": "checkpoint_committed",
            "phase": "main",
            "step": 4,
            "ranks": {"0": ALL, "1": ALL},
            "layout": {"dp": 2, "tp": 1, "pp": 1, "ep": 1},
            "world": 2,
            "audit": {
                str(r): {
                    "moments_nonzero": True,
                    "adam_t": 4,
                    "position": 4,
                    "rng": f"r{r}",
                    "cursor": [0, 8 + r],
                }
                for r in (0, 1)
            },
        }
    )
    ev.append({"event": "fault_injected", "phase": "main", "step": 5})
    ev.append(
        {
            "event": "failure_detected",
            "phase": "main",
            "step": 5,
            "dead": [1],
            "detected_by": "heartbeat",
            "errors": {"0": {"error": "PeerLost", "how": "eof"}},
        }
    )
    ev.append({"event": "resume", "phase": "main", "from_step": 4})
    ev.append(
        {
            "event": "recovery_complete",
            "phase": "main",
            "fail_step": 5,
            "resume_step": 5,
            "total_s": 45.0,
            "breakdown": {"detect_s": 15.0, "restart_s": 30.0, "relink_s": 0, "load_s": 0, "recompute_s": 0},
        }
    )
    ev += [{"event": "step_end", "phase": "main", "step": s, "digest": f"d{s}"} for s in range(5, 9)]
    ev.append({"event": "phase_end", "phase": "main", "digest": "d8"})
    ev += [{"event": "step_end", "phase": "reference", "step": s, "digest": f"d{s}"} for s in range(1, 9)]
    ev.append({"event": "phase_end", "phase": "reference", "digest": "d8"})
    return ev


def statuses(events: Events, expect: Expect | None = None) -> dict[str, str]:
    return {r.name: r.status for r in run_checks(events, expect or Expect(max_recovery_s=100))}


def test_good_journal_passes_every_check() -> None:
    results = run_checks(good_journal(), Expect(max_recovery_s=100))
    assert {r.name: r.status for r in results} == dict.fromkeys(
        [
            "recovered",
            "recovery_time",
            "checkpoint_complete",
            "matches_uninterrupted",
            "failures",
            "goodput",
            "detection",
            "learned_timeouts",
        ],
        "pass",
    )
    assert verdict(results) == ("pass", 0)


def test_recovered_fails_when_a_failure_was_never_recovered() -> None:
    ev = [e for e in good_journal() if e["event"] != "recovery_complete"]
    assert statuses(ev)["recovered"] == "fail"


def test_recovered_fails_when_the_main_phase_did_not_finish() -> None:
    ev = [e for e in good_journal() if not (e["event"] == "phase_end" and e["phase"] == "main")]
    assert statuses(ev)["recovered"] == "fail"


def test_a_fault_that_failed_nothing_counts_as_recovered_only_if_the_run_finished() -> None:
    ev = [e for e in good_journal() if e["event"] not in ("failure_detected", "recovery_complete")]
    assert statuses(ev)["recovered"] == "pass"
    ev = [e for e in ev if not (e["event"] == "phase_end" and e["phase"] == "main")]
    assert statuses(ev)["recovered"] == "fail"


def test_recovery_time_fails_past_the_bound() -> None:
    assert statuses(good_journal(), Expect(max_recovery_s=44.9))["recovery_time"] == "fail"
    assert statuses(good_journal(), Expect(max_recovery_s=45.0))["recovery_time"] == "pass"


def test_checkpoint_complete_names_each_missing_component_per_rank() -> None:
    ev = good_journal()
    commit = next(e for e in ev if e["event"] == "checkpoint_committed")
    commit["ranks"]["1"] = ["params", "lr_scheduler", "data_cursor"]
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert result.status == "fail"
    assert result.evidence["missing"] == {"1": ["optimizer", "rng"]}
    assert "optimizer, rng" in result.summary


def test_checkpoint_complete_fails_on_a_diverged_resume_and_names_the_step() -> None:
    ev = good_journal()
    for e in ev:
        if e["event"] == "step_end" and e["phase"] == "main" and e["step"] >= 6:
            e["digest"] = "other"
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert result.status == "fail"
    assert result.evidence["diverged"] == {"resumed_from": 4, "step": 6}


def test_checkpoint_complete_is_unknown_without_any_checkpoint() -> None:
    ev = [e for e in good_journal() if e["event"] != "checkpoint_committed"]
    assert statuses(ev)["checkpoint_complete"] == "unknown"


def test_checkpoint_complete_uses_the_probe_when_main_never_resumed() -> None:
    ev = [
        e
        for e in good_journal()
        if e.get("phase") != "reference"
        and e["event"] not in ("fault_injected", "failure_detected", "resume", "recovery_complete")
    ]
    ev.append({"event": "resume", "phase": "probe", "from_step": 4})
    ev += [{"event": "step_end", "phase": "probe", "step": s, "digest": f"d{s}"} for s in range(5, 9)]
    assert statuses(ev)["checkpoint_complete"] == "pass"
    bad = copy.deepcopy(ev)
    bad[-1]["digest"] = "x"
    assert statuses(bad)["checkpoint_complete"] == "fail"


def test_matches_uninterrupted_fails_on_different_final_parameters() -> None:
    ev = good_journal()
    ev[-1]["digest"] = "not-d8"
    assert statuses(ev)["matches_uninterrupted"] == "fail"


def test_expecting_false_inverts_the_judgement() -> None:
    ev = good_journal()
    commit = next(e for e in ev if e["event"] == "checkpoint_committed")
    commit["ranks"]["0"] = ["params"]
    assert statuses(ev, Expect(checkpoint_complete=False))["checkpoint_complete"] == "pass"
    assert statuses(good_journal(), Expect(checkpoint_complete=False))["checkpoint_complete"] == "fail"


def test_verdict_orders_fail_over_unknown_over_pass() -> None:
    ev = [e for e in good_journal() if e["event"] != "checkpoint_committed"]
    assert verdict(run_checks(ev, Expect()))[0] == "unknown"
    ev = [e for e in ev if e["event"] != "recovery_complete"]
    assert verdict(run_checks(ev, Expect())) == ("fail", 1)


def test_recovered_fails_when_the_job_failed_for_good() -> None:
    ev = good_journal()
    ev.insert(
        3, {"event": "job_failed", "error_type": "LinkSetupTimeout", "error": "link setup 0->1 needs 150 s"}
    )
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "recovered"]
    assert result.status == "fail" and "LinkSetupTimeout" in result.summary


def test_failures_fail_past_the_bound_and_name_the_first_cause() -> None:
    assert statuses(good_journal(), Expect(max_failures=1))["failures"] == "pass"
    (result,) = [r for r in run_checks(good_journal(), Expect(max_failures=0)) if r.name == "failures"]
    assert result.status == "fail"
    assert result.evidence["failures"] == [
        {"step": 5, "detected_by": "heartbeat", "cause": "rank(s) [1] died"}
    ]


def test_failures_report_the_direct_error_message() -> None:
    ev = good_journal()
    failure = next(e for e in ev if e["event"] == "failure_detected")
    failure["errors"] = {
        "2": {"error": "DeviceOOM", "how": "direct", "message": "rank 2: cannot allocate 4 MiB"}
    }
    (result,) = [r for r in run_checks(ev, Expect(max_failures=0)) if r.name == "failures"]
    assert "rank 2: cannot allocate 4 MiB" in result.summary


def timed_journal() -> Events:
    """Steps of 1 s; step 3 fails (its 1 s lost), 10 s of recovery, step 3 runs again; a 2 s checkpoint."""
    ev: Events = []
    t = 0.0
    for step in (1, 2, 3):
        ev.append(
            {"event": "step_end", "phase": "main", "step": step, "t_start": t, "t": t + 1, "digest": "d"}
        )
        t += 1
    ev.append(
        {
            "event": "checkpoint_committed",
            "phase": "main",
            "step": 3,
            "write_s": 2.0,
            "ranks": {},
            "t_saved": 3.0,
            "t_resume": 5.0,
            "t": 5.0,
        }
    )
    t += 2 + 1  # the write, then step 4's failed attempt
    ev.append(
        {
            "event": "failure_detected",
            "phase": "main",
            "step": 4,
            "dead": [1],
            "errors": {},
            "t_start": 5.0,
            "t_death": 6.0,
            "t": 16.0,
        }
    )
    ev.append(
        {
            "event": "recovery_complete",
            "phase": "main",
            "fail_step": 4,
            "resume_step": 4,
            "total_s": 10.0,
            "breakdown": {"detect_s": 10.0},
            "t_death": 6.0,
            "t_resume": 16.0,
        }
    )
    t += 10
    ev.append({"event": "step_end", "phase": "main", "step": 4, "t_start": t, "t": t + 1, "digest": "d"})
    ev.append({"event": "phase_end", "phase": "main", "t": t + 1, "digest": "d"})
    return ev


def test_goodput_is_useful_step_time_over_virtual_time() -> None:
    (g,) = [r for r in run_checks(timed_journal(), Expect(min_goodput=0.2)) if r.name == "goodput"]
    assert g.status == "pass"
    assert g.evidence["goodput"] == 4 / 17 and g.evidence["useful_s"] == 4.0 and g.evidence["total_s"] == 17.0
    assert (
        g.evidence["steps_lost"] == 1
        and g.evidence["checkpoint_s"] == 2.0
        and g.evidence["recovery_s"] == 10.0
        and g.evidence["lost_s"] == 1.0  # step 4's first attempt, until the death
        and g.evidence["other_s"] == 0.0
    )


def op_retried_journal(exec_s: float) -> Events:
    """Steps of 1 s; step 2's gradient sync loses a message half-way through the step, the exec timeout
    fires ``exec_s`` later, op retry holds 5 s and waits 1 s, and the retried sync completes the step."""
    ev: Events = [{"event": "step_end", "phase": "main", "step": 1, "t_start": 0.0, "t": 1.0, "digest": "d"}]
    t_resume = 1.5 + exec_s + 6.0
    ev.append(
        {
            "event": "failure_detected",
            "phase": "main",
            "step": 2,
            "t_start": 1.0,
            "t_death": 1.5,
            "t": 1.5 + exec_s,
        }
    )
    breakdown = {"detect_s": exec_s, "hold_s": 5.0, "interval_s": 1.0}
    ev.append(
        {
            "event": "recovery_complete",
            "phase": "main",
            "fail_step": 2,
            "resume_step": 2,
            "strategy": "op_retry",
            "breakdown": breakdown,
            "total_s": exec_s + 6.0,
            "t_death": 1.5,
            "t_resume": t_resume,
            "t": t_resume,
        }
    )
    ev.append(
        {"event": "step_end", "phase": "main", "step": 2, "t_start": 1.0, "t": t_resume + 0.5, "digest": "d"}
    )
    t = t_resume + 0.5
    ev.append({"event": "step_end", "phase": "main", "step": 3, "t_start": t, "t": t + 1.0, "digest": "d"})
    ev.append({"event": "phase_end", "phase": "main", "t": t + 1.0, "digest": "d"})
    return ev


def test_an_op_retry_inside_a_step_is_recovery_not_training() -> None:
    (g,) = [r for r in run_checks(op_retried_journal(1836.0), Expect()) if r.name == "goodput"]
    e = g.evidence
    assert e["useful_s"] == pytest.approx(3.0) and e["total_s"] == pytest.approx(1845.0)
    assert e["recovery_s"] == pytest.approx(1842.0) and e["goodput"] == pytest.approx(3.0 / 1845.0)
    parts = ("useful_s", "recovery_s", "checkpoint_s", "lost_s", "degraded_s", "other_s")
    assert sum(e[k] for k in parts) == pytest.approx(e["total_s"])
    assert "0.16% of 1845 s virtual time trained; 1842 s in recovery" in g.summary
    # a shorter exec timeout costs less in all: its goodput is higher, as it should be
    short = next(r for r in run_checks(op_retried_journal(60.0), Expect()) if r.name == "goodput")
    assert short.evidence["goodput"] > e["goodput"] and short.evidence["total_s"] < e["total_s"]


def test_goodput_fails_below_its_bound_and_is_unknown_for_an_unfinished_run() -> None:
    assert statuses(timed_journal(), Expect(min_goodput=0.25))["goodput"] == "fail"
    unfinished = [e for e in timed_journal() if e["event"] != "phase_end"]
    assert statuses(unfinished, Expect(min_goodput=0.1))["goodput"] == "unknown"
    recomputed = timed_journal()
    recomputed.insert(-1, {**recomputed[-2], "t_start": 17.0, "t": 18.0})  # step 4 run twice: one run lost
    recomputed[-1]["t"] = 18.0
    (g,) = [r for r in run_checks(recomputed, Expect()) if r.name == "goodput"]
    assert g.evidence["steps_lost"] == 2 and g.evidence["useful_s"] == 4.0


def audited(change: Any) -> str:
    """The checkpoint_complete status and summary after ``change`` edits the committed checkpoint's event."""
    ev = good_journal()
    commit = next(e for e in ev if e["event"] == "checkpoint_committed")
    change(commit)
    (r,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    return f"{r.status}: {r.summary}"


def test_the_audit_passes_a_meaningful_checkpoint() -> None:
    assert audited(lambda c: None).startswith("pass")


def test_the_audit_finds_zero_moments_a_stale_scheduler_a_shared_rng_and_no_layout() -> None:
    def zero(c: dict[str, Any]) -> None:
        c["audit"]["1"]["moments_nonzero"] = False

    def stale(c: dict[str, Any]) -> None:
        c["audit"]["0"]["position"] = 0

    def shared(c: dict[str, Any]) -> None:
        c["audit"]["1"]["rng"] = c["audit"]["0"]["rng"]

    def no_layout(c: dict[str, Any]) -> None:
        del c["layout"]

    def wrong_t(c: dict[str, Any]) -> None:
        c["audit"]["0"]["adam_t"] = 1

    assert "rank 1: the Adam moments are all zero" in audited(zero)
    assert "LR scheduler is at position 0, not 4" in audited(stale)
    assert "ranks 0, 1 saved the same RNG state" in audited(shared)
    assert "does not record a parallel layout" in audited(no_layout)
    assert "optimizer's step count is 1, not 4" in audited(wrong_t)
    for change in (zero, stale, shared, no_layout, wrong_t):
        assert audited(change).startswith("fail")


def test_a_shared_rng_is_fine_where_the_workload_keys_masks_by_counter() -> None:
    ev = good_journal()
    next(e for e in ev if e["event"] == "workload")["rng_per_rank"] = False
    commit = next(e for e in ev if e["event"] == "checkpoint_committed")
    commit["audit"]["1"]["rng"] = commit["audit"]["0"]["rng"]
    (r,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert r.status == "pass"


def _elastic_journal() -> Events:
    """The good journal's failure handled by an elastic shrink at step 5 instead of a restart; the
    probe resumes from the step-4 checkpoint; main's parameters differ from the reference's."""
    ev = [e for e in good_journal() if e["event"] != "resume"]
    for e in ev:
        if e["event"] == "step_end" and e["phase"] == "main" and e["step"] >= 5:
            e["digest"] = f"shrunk{e['step']}"
        if e["event"] == "phase_end" and e["phase"] == "main":
            e["digest"] = "shrunk8"
    ev.insert(-10, {"event": "elastic_shrink", "phase": "main", "step": 5})
    ev.append({"event": "resume", "phase": "probe", "from_step": 4})
    ev += [{"event": "step_end", "phase": "probe", "step": s, "digest": f"d{s}"} for s in range(5, 9)]
    return ev


def test_after_an_elastic_shrink_matches_uninterrupted_is_checked_only_when_expected() -> None:
    ev = _elastic_journal()
    assert statuses(ev)["matches_uninterrupted"] == "pass"  # by design, unless expected
    assert statuses(ev, Expect(matches_uninterrupted=True))["matches_uninterrupted"] == "fail"
    assert statuses(ev, Expect(matches_uninterrupted=False))["matches_uninterrupted"] == "pass"


def test_a_probe_is_compared_with_main_only_before_an_elastic_shrink_changed_its_course() -> None:
    ev = _elastic_journal()
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert result.status == "unknown"  # the shrink was at the step after the checkpoint: nothing to compare
    ev = [e for e in ev if e["event"] != "elastic_shrink"]
    ev.insert(-10, {"event": "elastic_shrink", "phase": "main", "step": 7})
    for e in ev:
        if e["event"] == "step_end" and e["phase"] == "main" and e["step"] in (5, 6):
            e["digest"] = f"d{e['step']}"
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert result.status == "pass" and result.evidence["steps_compared"] == 2
    ev[-4]["digest"] = "wrong"  # the probe's step 5 differs from main's, before the shrink
    (result,) = [r for r in run_checks(ev, Expect()) if r.name == "checkpoint_complete"]
    assert result.status == "fail" and result.evidence["diverged"] == {"resumed_from": 4, "step": 5}


def test_tolerances_accept_a_scalar_or_an_inclusive_range_and_fail_outside_it() -> None:
    from testbed.scenario.expect import Range

    ev = good_journal()  # one failure, recovered in 45 s
    assert statuses(ev, Expect(failures=Range(1, 1)))["failures"] == "pass"
    assert statuses(ev, Expect(failures=Range(2, 3)))["failures"] == "fail"
    assert statuses(ev, Expect(recovery_s=Range(40, 50)))["recovery_time"] == "pass"
    assert statuses(ev, Expect(recovery_s=Range(50, 60)))["recovery_time"] == "fail"  # quicker than expected
    assert statuses(ev, Expect(recovery_s=Range(0, 44)))["recovery_time"] == "fail"


def test_detection_fails_when_a_failure_was_found_by_a_detector_not_allowed() -> None:
    ev = good_journal()  # detected by heartbeat
    assert statuses(ev, Expect(detected_by=("heartbeat",)))["detection"] == "pass"
    (result,) = [r for r in run_checks(ev, Expect(detected_by=("exec_timeout",))) if r.name == "detection"]
    assert result.status == "fail" and "detected by heartbeat, not by exec_timeout" in result.summary
    no_failure = [e for e in ev if e["event"] != "failure_detected"]
    assert statuses(no_failure, Expect(detected_by=("heartbeat",)))["detection"] == "unknown"


def test_the_report_lists_the_checks_in_one_order_however_the_registry_was_first_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from testbed.core.registry import CHECKS
    from testbed.report.checks import BUILT_IN

    # as if the entry points (written in name order) had been read before this module registered
    alphabetical = dict(sorted(CHECKS.items()))
    monkeypatch.setattr(CHECKS, "_items", alphabetical)
    names = [r.name for r in run_checks([], Expect())]
    assert names[: len(BUILT_IN)] == [name for name, _ in BUILT_IN]
    assert names[0] == "recovered" and names[2] == "checkpoint_complete"


def test_goodput_counts_steps_that_overlap_once() -> None:
    """A pipeline without data parallelism starts step n+1 on its first stage while its last stage
    still ends step n: goodput never passes 100 %."""
    ev = [
        {"event": "step_end", "phase": "main", "step": s, "t_start": 3.0 * (s - 1), "t": 3.0 * s + 1.0}
        for s in (1, 2, 3)
    ]  # each step 4 s long, one after the other every 3 s: 1 s of each overlaps the next
    ev.append({"event": "phase_end", "phase": "main", "t": 10.0, "digest": "d"})
    (g,) = [r for r in run_checks(ev, Expect()) if r.name == "goodput"]
    assert g.evidence["useful_s"] == 10.0 and g.evidence["goodput"] == 1.0


@given(
    st.lists(
        st.tuples(st.floats(0, 50), st.floats(0, 5), st.sampled_from(["step", "recovery", "checkpoint"])),
        max_size=12,
    ),
    st.floats(0.5, 1.0),
)
def test_goodput_parts_add_up_to_the_total_whatever_overlaps(spans: list[Any], share: float) -> None:
    ev: Events = []
    for i, (start, length, kind) in enumerate(spans):
        end = start + length
        if kind == "step":
            ev.append(
                {
                    "event": "step_end",
                    "phase": "main",
                    "step": i,
                    "t_start": start,
                    "t": end,
                    "dp_share": share,
                }
            )
        elif kind == "recovery":
            ev.append({"event": "recovery_complete", "phase": "main", "t_death": start, "t_resume": end})
        else:
            ev.append(
                {
                    "event": "checkpoint_committed",
                    "phase": "main",
                    "t_saved": start,
                    "t_resume": end,
                    "t": end,
                    "write_s": length,
                }
            )
    ev.insert(0, {"event": "step_end", "phase": "main", "step": -1, "t_start": 0.0, "t": 1.0})
    ev.append({"event": "phase_end", "phase": "main", "t": 60.0})
    g = goodput(ev)
    assert g is not None
    parts = ("useful_s", "recovery_s", "checkpoint_s", "lost_s", "degraded_s", "other_s")
    assert sum(g[k] for k in parts) == pytest.approx(60.0)
    assert 0.0 <= g["goodput"] <= 1.0 and all(g[k] >= 0 for k in parts)


def test_leaf_differences_measure_the_gap_and_name_the_worst_leaf() -> None:
    import numpy as np

    from testbed.control.divergence import gather
    from testbed.train.rank_state import leaf_difference

    kept = {"w": np.array([1.0, -2.0]), "b": np.zeros(2), "gone": np.ones(1)}
    now = {"w": np.array([1.0, 2.0]), "b": np.array([0.0, 0.5]), "new": np.ones(1)}
    d = leaf_difference(kept, now)
    assert d == {"max_abs": 4.0, "max_rel": 2.0, "leaves": 4, "leaf": "w", "mismatched": ["gone", "new"]}
    assert leaf_difference(kept, kept) == {
        "max_abs": 0.0,
        "max_rel": 0.0,
        "leaves": 0,
        "leaf": None,
        "mismatched": [],
    }
    both = gather({0: {"params": leaf_difference(kept, kept)}, 1: {"params": d}})
    assert both["params"]["rank"] == 1 and both["params"]["max_abs"] == 4.0 and both["params"]["leaves"] == 4
    assert both["params"]["mismatched"] == {"1": ["gone", "new"]}


def _ended_at_link_setup() -> list[dict[str, Any]]:
    """A journal whose job failed for good at link setup, before any step (version_mismatch.yaml's)."""
    return [
        {"event": "plan", "faults": []},
        {
            "event": "job_failed",
            "phase": "main",
            "step": 0,
            "error_type": "LinkSetupError",
            "error": "rank 2: link setup 3->2 failed right after connect (HCCL EI0005)",
        },
    ]


def test_a_failure_at_link_setup_is_a_failure_and_leaves_goodput_and_detection_nothing_to_judge() -> None:
    results = {r.name: r for r in run_checks(_ended_at_link_setup(), Expect())}
    failures = results["failures"]
    assert failures.status == "pass" and failures.summary.startswith("1 failure(s); first at the job's start")
    assert "LinkSetupError" in failures.summary
    bounded = {r.name: r.status for r in run_checks(_ended_at_link_setup(), Expect(max_failures=0))}
    assert bounded["failures"] == "fail"  # a bound of none fails on it
    assert results["goodput"].status == "unknown" and "nothing to judge" in results["goodput"].summary
    assert results["detection"].status == "unknown" and "LinkSetupError" in results["detection"].summary


def test_a_failure_a_recovery_saw_is_not_counted_twice_when_the_job_then_fails() -> None:
    ev = [e for e in good_journal() if e["event"] not in ("recovery_complete", "phase_end")]
    ev.append(
        {"event": "job_failed", "phase": "main", "step": 5, "error_type": "RecoveryFailed", "error": "x"}
    )
    (failures,) = [r for r in run_checks(ev, Expect()) if r.name == "failures"]
    assert failures.summary.startswith("1 failure(s); first at step 5")
    after = [
        *good_journal(),
        {"event": "job_failed", "phase": "main", "step": 7, "error_type": "X", "error": "y"},
    ]
    (failures,) = [r for r in run_checks(after, Expect()) if r.name == "failures"]
    assert failures.summary.startswith("2 failure(s)")  # a later end, after a completed recovery, is one more


def _reference_skipped(journal: Events) -> Events:
    """``journal`` as a run that says ``expect.reference_run: false`` leaves it: no reference phase."""
    ev = [e for e in journal if e.get("phase") != "reference"]
    ev.append({"event": "reference_skipped", "reason": "expect.reference_run is false"})
    return ev


def test_a_skipped_reference_is_said_and_missing_components_still_fail() -> None:
    ev = _reference_skipped(good_journal())
    results = {r.name: r for r in run_checks(ev, Expect(max_recovery_s=100))}
    same = results["matches_uninterrupted"]
    assert same.status == "pass" and same.summary.startswith("not judged: the scenario skips the reference")
    complete = results["checkpoint_complete"]
    assert complete.status == "pass" and "the resume was not compared" in complete.summary
    assert complete.evidence["steps_compared"] == 0 and complete.evidence["skipped"]
    assert verdict(list(results.values())) == ("pass", 0)
    bad = copy.deepcopy(ev)
    next(e for e in bad if e["event"] == "checkpoint_committed")["ranks"]["1"] = ["params"]
    assert statuses(bad)["checkpoint_complete"] == "fail"
    # without the event, a journal with no reference run after a resume is not judged a pass
    unsaid = [e for e in ev if e["event"] != "reference_skipped"]
    assert statuses(unsaid)["matches_uninterrupted"] == "unknown"
    assert statuses(unsaid)["checkpoint_complete"] == "unknown"
