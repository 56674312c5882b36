"""Harness checks: pure functions of the journal (and the scenario's ``expect``).

Each check returns a :class:`CheckResult` with a status (``pass``, ``fail``
or ``unknown``), what it observed, and the evidence a reviewer needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.core.registry import CHECKS
from testbed.report.goodput import goodput
from testbed.scenario.model import Expect, Range

Events = list[dict[str, Any]]
PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "status": self.status, "summary": self.summary, "evidence": self.evidence}


def _of(events: Events, name: str, phase: str | None = None) -> Events:
    return [e for e in events if e.get("event") == name and (phase is None or e.get("phase") == phase)]


def _judge(
    name: str, observed: bool, expected: bool | None, summary: str, evidence: dict[str, Any]
) -> CheckResult:
    want = True if expected is None else expected
    status = PASS if observed == want else FAIL
    if expected is False:
        summary += f" (expected {name}: false)"
    return CheckResult(name, status, summary, {**evidence, "observed": observed, "expected": want})


def check_recovered(events: Events, expect: Expect) -> CheckResult:
    """Every injected fault was followed by a completed recovery, and the main phase finished."""
    injected = _of(events, "fault_injected", "main")
    completed = _of(events, "recovery_complete", "main")
    finished = bool(_of(events, "phase_end", "main"))
    detected = _of(events, "failure_detected", "main")
    evidence: dict[str, Any] = {
        "faults": len(injected),
        "failures": len(detected),
        "recoveries": len(completed),
        "main_finished": finished,
    }
    failed = _of(events, "job_failed")
    if failed:
        evidence["job_failed"] = failed[0]["error"]
        summary = f"the job failed for good: {failed[0]['error_type']}: {failed[0]['error']}"
        return _judge("recovered", False, expect.recovered, summary, evidence)
    if not injected and not detected:
        return _judge(
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
    return _judge("recovered", ok, expect.recovered, summary, evidence)


def check_recovery_time(events: Events, expect: Expect) -> CheckResult:
    """Each recovery's virtual time, broken down; fails past ``expect.max_recovery_s``."""
    recs = _of(events, "recovery_complete", "main")
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


def _steps(events: Events, phase: str) -> dict[int, str]:
    """The last digest journalled for each step of ``phase`` (a recomputed step overwrites)."""
    return {e["step"]: e["digest"] for e in _of(events, "step_end", phase)}


def _from_storage(e: dict[str, Any]) -> bool:
    """A resume from a persistent checkpoint (not from an in-memory replica)."""
    return e.get("source", "checkpoint") == "checkpoint"


def _resumed_segments(events: Events) -> tuple[list[tuple[int, dict[int, str]]], dict[int, str], str]:
    """(resume step and the digests after it) for each resume from a persistent checkpoint, the
    uninterrupted digests, and their source."""
    segments: list[tuple[int, dict[int, str]]] = []
    current: tuple[int, dict[int, str]] | None = None
    main_resumes = any(_from_storage(e) for e in _of(events, "resume", "main"))
    resumed_phase = "main" if main_resumes else "probe"
    for e in events:
        if e.get("phase") != resumed_phase:
            continue
        if e["event"] == "resume":
            current = (int(e["from_step"]), {}) if _from_storage(e) else None
            if current is not None:
                segments.append(current)
        elif e["event"] == "step_end" and current is not None:
            current[1][int(e["step"])] = e["digest"]
    if main_resumes:
        return segments, _steps(events, "reference"), "reference"
    # the probe continues the run that wrote the checkpoint, up to where an elastic shrink changed its course
    shrinks = [int(e["step"]) for e in _of(events, "elastic_shrink", "main")]
    segments = [
        (c, {k: d for k, d in ds.items() if not any(c < s <= k for s in shrinks)}) for c, ds in segments
    ]
    return segments, _steps(events, "main"), "main"


def _audit(commits: Events, rng_per_rank: bool) -> list[str]:
    """What the saved state says is wrong, beyond missing components (the users' real complaints)."""
    problems: list[str] = []
    for c in commits:
        step, audit = int(c["step"]), c.get("audit", {})
        layout = c.get("layout")
        if layout is None or (c.get("world") and math.prod(layout.values()) != c["world"]):
            problems.append(
                f"step {step}: the manifest does not record a parallel layout that fits the world"
            )
        for rank, a in sorted(audit.items(), key=lambda kv: int(kv[0])):
            if a.get("moments_nonzero") is False:
                problems.append(
                    f"step {step}, rank {rank}: the Adam moments are all zero (optimizer state never saved?)"
                )
            if "adam_t" in a and a["adam_t"] != step:
                problems.append(
                    f"step {step}, rank {rank}: the optimizer's step count is {a['adam_t']}, not {step}"
                )
            if "position" in a and a["position"] != step:
                problems.append(
                    f"step {step}, rank {rank}: the LR scheduler is at position {a['position']}, not {step} "
                    "(was it dropped on a resume?)"
                )
        rngs: dict[str, list[str]] = {}
        for rank, a in audit.items():
            if "rng" in a:
                rngs.setdefault(a["rng"], []).append(rank)
        shared = [sorted(r, key=int) for r in rngs.values() if len(r) > 1]
        if rng_per_rank and shared:
            problems.append(
                f"step {step}: ranks {', '.join(map(str, shared[0]))} saved the same RNG state "
                "(saved from one rank only?)"
            )
    return problems


def check_checkpoint_complete(events: Events, expect: Expect) -> CheckResult:
    """Every declared component is in every rank's shard, and a resume continues bit for bit."""
    workload = next((e for e in events if e.get("event") == "workload"), {})
    declared: list[str] = workload.get("components", [])
    commits = _of(events, "checkpoint_committed", "main")
    if not commits:
        return CheckResult("checkpoint_complete", UNKNOWN, "no checkpoint was committed", {})
    missing: dict[str, list[str]] = {}
    for c in commits:
        for rank, present in c["ranks"].items():
            gap = sorted(set(declared) - set(present))
            if gap:
                missing[rank] = gap
    segments, reference, source = _resumed_segments(events)
    compared, diverged = 0, None
    for from_step, digests in segments:
        for step in sorted(digests):
            if step not in reference:
                continue
            compared += 1
            if digests[step] != reference[step] and diverged is None:
                diverged = {"resumed_from": from_step, "step": step}
    audit = _audit(commits, bool(workload.get("rng_per_rank", True)))
    evidence: dict[str, Any] = {
        "declared": declared,
        "missing": missing,
        "audit": audit,
        "steps_compared": compared,
        "compared_with": source,
        "diverged": diverged,
    }
    gaps = sorted({c for g in missing.values() for c in g})
    parts = [f"missing {', '.join(gaps)} on {len(missing)} rank(s)" if gaps else "all components present"]
    if audit:
        parts.append(f"{len(audit)} audit finding(s), first: {audit[0]}")
    if diverged is not None:
        parts.append(
            f"resumed from step {diverged['resumed_from']}, diverged from the uninterrupted run "
            f"at step {diverged['step']}"
        )
    elif compared:
        parts.append(f"resume matched the uninterrupted run bit for bit over {compared} step(s)")
    else:
        parts.append("no resume to compare")
    if compared == 0 and not gaps and not audit:
        return CheckResult("checkpoint_complete", UNKNOWN, "; ".join(parts), evidence)
    return _judge(
        "checkpoint_complete",
        not gaps and not audit and diverged is None,
        expect.checkpoint_complete,
        "; ".join(parts),
        evidence,
    )


def check_matches_uninterrupted(events: Events, expect: Expect) -> CheckResult:
    """The final parameters equal those of an uninterrupted run of the same seed."""
    ends = {e["phase"]: e for e in _of(events, "phase_end")}
    if "main" not in ends:
        return CheckResult("matches_uninterrupted", UNKNOWN, "the main phase did not finish", {})
    if "reference" not in ends:
        if _of(events, "resume", "main"):
            return CheckResult("matches_uninterrupted", UNKNOWN, "no reference run to compare", {})
        return _judge(
            "matches_uninterrupted",
            True,
            expect.matches_uninterrupted,
            "the main run was itself uninterrupted",
            {"digest": ends["main"]["digest"]},
        )
    same = ends["main"]["digest"] == ends["reference"]["digest"]
    summary = "final parameters " + ("equal" if same else "differ from") + " the uninterrupted run's"
    evidence = {"main": ends["main"]["digest"], "reference": ends["reference"]["digest"]}
    if expect.matches_uninterrupted is None and _of(events, "elastic_shrink", "main"):
        summary += (
            " (an elastic shrink trains some steps on fewer samples by design: not checked unless "
            "expect.matches_uninterrupted is set)"
        )
        return CheckResult("matches_uninterrupted", PASS, summary, {**evidence, "observed": same})
    return _judge("matches_uninterrupted", same, expect.matches_uninterrupted, summary, evidence)


def check_failures(events: Events, expect: Expect) -> CheckResult:
    """How many times the main phase failed; fails past ``expect.max_failures``."""
    failures = _of(events, "failure_detected", "main")
    causes = []
    for f in failures:
        direct = [e for e in f.get("errors", {}).values() if e.get("how") == "direct"]
        what = direct[0].get("message") or direct[0]["error"] if direct else f"rank(s) {f.get('dead')} died"
        causes.append({"step": f.get("step"), "detected_by": f.get("detected_by"), "cause": what})
    bound = expect.failures or (None if expect.max_failures is None else Range(0, expect.max_failures))
    allowed = (
        ""
        if bound is None
        else (f", at most {bound.hi:g} allowed" if bound.lo == 0 else f", {bound} expected")
    )
    summary = f"{len(failures)} failure(s){allowed}"
    if causes:
        summary += f"; first at step {causes[0]['step']}: {causes[0]['cause']}"
    status = PASS if bound is None or bound.holds(len(failures)) else FAIL
    return CheckResult(
        "failures", status, summary, {"failures": causes, "bound": None if bound is None else str(bound)}
    )


def check_goodput(events: Events, expect: Expect) -> CheckResult:
    """Useful step time over total virtual time of the main phase; fails below ``expect.min_goodput``."""
    g = goodput(events)
    bound = expect.goodput or (None if expect.min_goodput is None else Range(expect.min_goodput, 1.0))
    if g is None:
        return CheckResult("goodput", UNKNOWN if bound is not None else PASS, "no step ran", {"bound": bound})
    summary = (
        f"{g['goodput']:.1%} of {g['total_s']:.4g} s virtual time trained ({g['steps_lost']} step run(s) "
        f"lost, {g['recovery_s']:.4g} s in recovery, {g['checkpoint_s']:.4g} s writing checkpoints)"
    )
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
    """Every failure of the main phase was found by a detector ``expect.detected_by`` allows."""
    found = [(f.get("step"), f.get("detected_by")) for f in _of(events, "failure_detected", "main")]
    allowed = expect.detected_by
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
    learned = _of(events, "timeouts_learned", "main")
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


#: a check: the journal and the scenario's expect in, a result out
Check = Callable[[Events, Expect], CheckResult]


def register_check(name: str, check: Check) -> Check:
    """Make ``check`` run in every run's report (after the built-in ones), under ``name``."""
    registered: Check = CHECKS.register(name, check)
    return registered


for _name, _check in (
    ("recovered", check_recovered),
    ("recovery_time", check_recovery_time),
    ("checkpoint_complete", check_checkpoint_complete),
    ("matches_uninterrupted", check_matches_uninterrupted),
    ("failures", check_failures),
    ("goodput", check_goodput),
    ("detection", check_detection),
    ("learned_timeouts", check_learned_timeouts),
):
    register_check(_name, _check)


def run_checks(events: Events, expect: Expect) -> list[CheckResult]:
    """Every check, in a fixed order."""
    return [check(events, expect) for check in CHECKS.values()]


def verdict(results: list[CheckResult]) -> tuple[str, int]:
    """(verdict, exit code): any fail is 1, else any unknown is 2, else pass 0."""
    statuses = {r.status for r in results}
    if FAIL in statuses:
        return "fail", 1
    if UNKNOWN in statuses:
        return "unknown", 2
    return "pass", 0


def declared(expect: Expect, outcome: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether a run came to the verdict its scenario declares (``expect.verdict``), failing exactly
    the checks it names (``expect.fails``), with the reason when it did not.

    ``outcome`` is the run's verdict and ``results`` its checks as the report holds them. A scenario
    that declares nothing declares a pass.
    """
    failed = [r["name"] for r in results if r["status"] == FAIL]
    want = list(expect.fails)
    why = ""
    if outcome != expect.verdict:
        why = f"the run's verdict is {outcome}, the scenario declares {expect.verdict}"
        if failed:
            why += f" (failed: {', '.join(failed)})"
    elif want and set(failed) != set(want):
        unexpected = [n for n in failed if n not in want]
        missed = [n for n in want if n not in failed]
        parts = [f"{', '.join(missed)} did not fail" if missed else ""]
        parts.append(f"{', '.join(unexpected)} failed too" if unexpected else "")
        why = "; ".join(p for p in parts if p) + f" (declared to fail: {', '.join(want)})"
    return {
        "verdict": expect.verdict,
        "fails": want,
        "got": outcome,
        "failed": failed,
        "as_declared": not why,
        "why": why,
    }
