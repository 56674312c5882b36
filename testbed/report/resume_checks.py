"""The checks of what a resume restores: every component in every shard, bit-for-bit resume, and
final parameters equal to an uninterrupted run's. Pure functions of the journal."""

from __future__ import annotations

import math
from typing import Any

from testbed.report.check_result import PASS, UNKNOWN, CheckResult, Events, judge, of
from testbed.report.integrity_checks import struck
from testbed.scenario.expect import Expect

#: why a check did not compare with the uninterrupted run (a scenario that says so cannot also expect it)
SKIPPED = "the scenario skips the reference run (expect.reference_run: false)"


def _steps(events: Events, phase: str) -> dict[int, str]:
    """The last digest journalled for each step of ``phase`` (a recomputed step overwrites)."""
    return {e["step"]: e["digest"] for e in of(events, "step_end", phase)}


def _from_storage(e: dict[str, Any]) -> bool:
    """A resume from a persistent checkpoint (not from an in-memory replica)."""
    return e.get("source", "checkpoint") == "checkpoint"


def _resumed_segments(events: Events) -> tuple[list[tuple[int, dict[int, str]]], dict[int, str], str]:
    """(resume step and the digests after it) for each resume from a persistent checkpoint, the
    uninterrupted digests, and their source."""
    segments: list[tuple[int, dict[int, str]]] = []
    current: tuple[int, dict[int, str]] | None = None
    main_resumes = any(_from_storage(e) for e in of(events, "resume", "main"))
    resumed_phase = "main" if main_resumes else "probe"
    for e in events:
        if e.get("phase") != resumed_phase:
            continue
        if e["event"] == "resume":
            current = (int(e["from_step"]), {}) if _from_storage(e) else None
            if current is not None:
                segments.append(current)
        elif e["event"] == "step_end" and current is not None:
            if struck(e):  # a silent corruption struck again: what follows is not the resume's doing
                current = None
                continue
            current[1][int(e["step"])] = e["digest"]
    if main_resumes:
        return segments, _steps(events, "reference"), "reference"
    # the probe continues the run that wrote the checkpoint, up to where an elastic shrink changed its course
    shrinks = [int(e["step"]) for e in of(events, "elastic_shrink", "main")]
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
    commits = of(events, "checkpoint_committed", "main")
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
    skipped = not compared and source == "reference" and bool(of(events, "reference_skipped"))
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
    elif skipped:
        parts.append(f"the resume was not compared: {SKIPPED}")
        evidence["skipped"] = True
    else:
        parts.append("no resume to compare")
    if compared == 0 and not gaps and not audit and not skipped:
        return CheckResult("checkpoint_complete", UNKNOWN, "; ".join(parts), evidence)
    return judge(
        "checkpoint_complete",
        not gaps and not audit and diverged is None,
        expect.checkpoint_complete,
        "; ".join(parts),
        evidence,
    )


def divergence_sizes(components: dict[str, dict[str, Any]]) -> str:
    """How far each component that differs ended from the uninterrupted run's, largest first."""
    differ = [(n, c) for n, c in components.items() if c["leaves"]]
    parts = []
    for name, c in sorted(differ, key=lambda nc: -nc[1]["max_rel"]):
        where = f"{c['leaf']} of rank {c['rank']}" if c["leaf"] is not None else "shapes differ"
        leaves = f"{c['leaves']} " + ("leaf" if c["leaves"] == 1 else "leaves")
        parts.append(
            f"{name} max |diff| {c['max_abs']:.3g} (relative {c['max_rel']:.3g}; {leaves}, "
            f"largest at {where})"
        )
    return "; ".join(parts)


def check_matches_uninterrupted(events: Events, expect: Expect) -> CheckResult:
    """The final parameters equal those of an uninterrupted run of the same seed."""
    ends = {e["phase"]: e for e in of(events, "phase_end")}
    if "main" not in ends:
        return CheckResult("matches_uninterrupted", UNKNOWN, "the main phase did not finish", {})
    if of(events, "reference_skipped"):  # the scenario chose so, and cannot also expect this check
        return CheckResult("matches_uninterrupted", PASS, f"not judged: {SKIPPED}", {"skipped": True})
    if "reference" not in ends:
        if of(events, "resume", "main"):
            return CheckResult("matches_uninterrupted", UNKNOWN, "no reference run to compare", {})
        return judge(
            "matches_uninterrupted",
            True,
            expect.matches_uninterrupted,
            "the main run was itself uninterrupted",
            {"digest": ends["main"]["digest"]},
        )
    same = ends["main"]["digest"] == ends["reference"]["digest"]
    summary = "final parameters " + ("equal" if same else "differ from") + " the uninterrupted run's"
    evidence: dict[str, Any] = {"main": ends["main"]["digest"], "reference": ends["reference"]["digest"]}
    skipped = [(int(e["step"]), int(e["batches"])) for e in of(events, "batches_skipped", "reference")]
    if skipped:  # a rollback skipped data: the yardstick is the run that skipped the same batches
        evidence["skipped_batches"] = skipped
        summary += (
            " (which skipped the same batches: " + ", ".join(f"{n} before step {s}" for s, n in skipped) + ")"
        )
    found = next(iter(of(events, "divergence")), None)
    if found is not None:
        evidence["divergence"] = found["components"]
        sizes = divergence_sizes(found["components"])
        if sizes:
            summary += ("; " if same else ": ") + sizes
    if expect.matches_uninterrupted is None and of(events, "elastic_shrink", "main"):
        summary += (
            " (an elastic shrink trains some steps on fewer samples by design: not checked unless "
            "expect.matches_uninterrupted is set)"
        )
        return CheckResult("matches_uninterrupted", PASS, summary, {**evidence, "observed": same})
    return judge("matches_uninterrupted", same, expect.matches_uninterrupted, summary, evidence)
