"""The checks of how a run failed and came back: recovered, recovery time, failures, goodput,
detection, learned timeouts. Pure functions of the journal and the scenario's ``expect``."""

from __future__ import annotations

from typing import Any

from testbed.report.check_result import FAIL, PASS, UNKNOWN, CheckResult, Events, judge, of
from testbed.report.goodput import describe, goodput
from testbed.scenario.expect import Expect, Range


def check_recovered(events: Events, expect: Expect) -> CheckResult:
    """Every injected fault was followed by a completed recovery, and the main phase finished."""
    injected = of(events, "fault_injected", "main")
    completed = of(events, "recovery_complete", "main")
    finished = bool(of(events, "phase_end", "main"))
    detected = of(events, "failure_detected", "main")
    evidence: dict[str, Any] = {
        "faults": len(injected),
        "failures": len(detected),
        "recoveries": len(completed),
        "main_finished": finished,
    }
    failed = of(events, "job_failed")
    if failed:
        evidence["job_failed"] = failed[0]["error"]
        summary = f"the job failed for good: {failed[0]['error_type']}: {failed[0]['error']}"
        return judge("recovered", False, expect.recovered, summary, evidence)
    if not injected and not detected:
        return judge(
            "recovered",
            finished,
            expect.recovered,
            "no fault was injected and nothing failed; the run "
            + ("finished" if finished else "did not finish"),
            evidence,
        )
    order = [e.get("event") for e in events if e.get("phase") == "main"]
    last_failure = max((i for i, name in enumerate(order) if name == "failure_detected"), default=-1)
    ok = finished and (not detected or "recovery_complete" in order[last_failure + 1 :])
    summary = f"{len(detected)} failure(s), {len(completed)} recovery(ies) completed, main phase " + (
        "finished" if finished else "did not finish"
    )
    if not detected:
        summary = f"{len(injected)} fault(s) injected, none made the job fail; main phase " + (
            "finished" if finished else "did not finish"
        )
    return judge("recovered", ok, expect.recovered, summary, evidence)


def check_recovery_time(events: Events, expect: Expect) -> CheckResult:
    """Each recovery's virtual time, broken down; fails past ``expect.max_recovery_s``."""
    recs = of(events, "recovery_complete", "main")
    items = [
        {
            "fail_step": r["fail_step"],
            "resume_step": r["resume_step"],
            "total_s": r["total_s"],
            "breakdown": r["breakdown"],
            "wall_s": r.get("wall_recovery_s"),
        }
        for r in recs
    ]
    bound = expect.recovery_s or (
        None if expect.max_recovery_s is None else Range(0.0, expect.max_recovery_s)
    )
    shown = None if bound is None else (f"{bound.hi:g}" if bound.lo == 0 else str(bound))
    if not recs:
        status = UNKNOWN if bound is not None else PASS
        return CheckResult("recovery_time", status, "no recovery happened", {"bound_s": shown})
    worst, best = max(r["total_s"] for r in recs), min(r["total_s"] for r in recs)
    if bound is None:
        return CheckResult(
            "recovery_time", PASS, f"slowest recovery {worst:.3f} s (no bound set)", {"recoveries": items}
        )
    status = PASS if bound.holds(worst) and bound.holds(best) else FAIL
    return CheckResult(
        "recovery_time",
        status,
        f"slowest recovery {worst:.3f} s"
        + (f", quickest {best:.3f} s" if bound.lo > 0 else "")
        + f", bound {shown} s",
        {"recoveries": items, "bound_s": shown},
    )


def failed_unseen(events: Events) -> dict[str, Any] | None:
    """The job's end for good when no detected failure stands for it: it failed at link setup, or at
    its start, before any recovery could see it (None: it did not, or a detected failure did)."""
    ended = next((e for e in events if e.get("event") == "job_failed"), None)
    if ended is None:
        return None
    last = None
    for e in events:
        if e.get("phase", "main") == "main" and e.get("event") in ("failure_detected", "recovery_complete"):
            last = e["event"]
    return ended if last != "failure_detected" else None


def check_failures(events: Events, expect: Expect) -> CheckResult:
    """How many times the main phase failed (a failure at link setup or at start, which ends the job
    before any recovery sees it, included); fails past ``expect.max_failures``."""
    failures = of(events, "failure_detected", "main")
    causes = []
    for f in failures:
        direct = [e for e in f.get("errors", {}).values() if e.get("how") == "direct"]
        what = direct[0].get("message") or direct[0]["error"] if direct else f"rank(s) {f.get('dead')} died"
        causes.append({"step": f.get("step"), "detected_by": f.get("detected_by"), "cause": what})
    unseen = failed_unseen(events)
    if unseen is not None:
        what = f"{unseen.get('error_type')}: {unseen.get('error')}"
        causes.append({"step": int(unseen.get("step", 0)), "detected_by": None, "cause": what})
        failures = [*failures, unseen]
    bound = expect.failures or (None if expect.max_failures is None else Range(0, expect.max_failures))
    allowed = (
        ""
        if bound is None
        else (f", at most {bound.hi:g} allowed" if bound.lo == 0 else f", {bound} expected")
    )
    summary = f"{len(failures)} failure(s){allowed}"
    if causes:
        at = causes[0]["step"]
        when = f"at step {at}" if at else "at the job's start (link setup, before step 1)"
        summary += f"; first {when}: {causes[0]['cause']}"
    status = PASS if bound is None or bound.holds(len(failures)) else FAIL
    return CheckResult(
        "failures", status, summary, {"failures": causes, "bound": None if bound is None else str(bound)}
    )


def check_goodput(events: Events, expect: Expect) -> CheckResult:
    """Useful step time over total virtual time of the main phase; fails below ``expect.min_goodput``."""
    g = goodput(events)
    bound = expect.goodput or (None if expect.min_goodput is None else Range(expect.min_goodput, 1.0))
    if g is None and not of(events, "step_end", "main"):  # nothing to judge
        return CheckResult("goodput", UNKNOWN, "no step ran: nothing to judge", {"bound": bound})
    if g is None:  # steps without virtual times: a journal of an older version
        return CheckResult(
            "goodput", UNKNOWN if bound is not None else PASS, "no step timed", {"bound": bound}
        )
    summary = describe(g)
    if bound is None:
        return CheckResult("goodput", PASS, summary + " (no bound set)", {**g, "bound": None})
    shown = f"{bound.lo:.1%}" if bound.hi >= 1.0 else f"[{bound.lo:.1%}, {bound.hi:.1%}]"
    if not g["finished"]:
        return CheckResult(
            "goodput", UNKNOWN, summary + "; the main phase did not finish", {**g, "bound": shown}
        )
    status = PASS if bound.holds(g["goodput"]) else FAIL
    return CheckResult("goodput", status, f"{summary}, bound {shown}", {**g, "bound": shown})


def check_detection(events: Events, expect: Expect) -> CheckResult:
    """Every failure of the main phase (and every silent corruption found) was found by a detector
    ``expect.detected_by`` allows."""
    found = [(f.get("step"), f.get("detected_by")) for f in of(events, "failure_detected", "main")]
    found += [(f.get("step"), f.get("detector")) for f in of(events, "sdc_detected", "main")]
    allowed = expect.detected_by
    unseen = failed_unseen(events)
    if unseen is not None and not found:  # the job ended before a detector could judge
        summary = (
            f"no detector saw the failure that ended the job ({unseen.get('error_type')}): nothing to judge"
        )
        return CheckResult(
            "detection", UNKNOWN, summary, {"allowed": None if allowed is None else list(allowed)}
        )
    if allowed is None:
        seen = sorted({str(d) for _, d in found})
        return CheckResult("detection", PASS, f"detected by {', '.join(seen) or 'nothing (no failure)'}", {})
    if not found:
        return CheckResult("detection", UNKNOWN, "no failure was detected", {"allowed": list(allowed)})
    wrong = [(s, d) for s, d in found if d not in allowed]
    if wrong:
        step, detector = wrong[0]
        summary = f"the failure at step {step} was detected by {detector}, not by {' or '.join(allowed)}"
        return CheckResult("detection", FAIL, summary, {"allowed": list(allowed), "wrong": wrong})
    return CheckResult(
        "detection", PASS, f"every failure detected by {' or '.join(allowed)}", {"allowed": list(allowed)}
    )


def check_learned_timeouts(events: Events, expect: Expect) -> CheckResult:
    """No healthy phase of the main run outlasted a learned timeout (which would have fired falsely)."""
    learned = of(events, "timeouts_learned", "main")
    exceeded = [e for e in events if e.get("event") == "learned_timeout_exceeded"]
    if not learned and not exceeded:
        return CheckResult("learned_timeouts", PASS, "timeouts are not learned in this run", {})
    values = {k: learned[-1][k] for k in ("setup", "step", "checkpoint") if learned and k in learned[-1]}
    shown = ", ".join(f"{k} {v:.4g} s" for k, v in values.items()) or "none yet"
    if exceeded:
        first = exceeded[0]
        where = f"step {first['step']}" if "step" in first else f"epoch {first.get('epoch')}"
        return CheckResult(
            "learned_timeouts",
            FAIL,
            f"{len(exceeded)} false timeout(s): a healthy {first['phase_of_job']} took "
            f"{first['interval']:.4g} s at {where}, past the learned {first['timeout']:.4g} s; raise "
            f"policy.timeouts.learn.safety_factor or warmup_steps (learned: {shown})",
            {"exceeded": exceeded, "learned": values},
        )
    return CheckResult(
        "learned_timeouts",
        PASS,
        f"no healthy phase outlasted its learned timeout ({shown})",
        {"learned": values},
    )
