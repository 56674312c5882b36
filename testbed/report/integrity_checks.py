"""The integrity checks: silent corruptions against what the detectors said, as pure functions of
the journal. The journal holds the truth (each ``step_end`` names what a corruption changed), so a
detection policy is scored exactly:

- ``sdc_detected``: every corruption detected, within ``expect.max_detection_steps`` of its onset;
- ``sdc_attribution``: whom each detection blamed against who was corrupted (a confusion
  matrix); blaming or excluding a healthy NPU fails;
- ``sdc_false_alarms``: detections while no rank's state held a corruption, per 1,000 steps, at most
  ``expect.max_false_alarms`` (0 unless set);
- ``no_poisoned_resume``: no resume restored a checkpoint written after a corruption's onset that
  no rollback had undone (confirmed against the uninterrupted run's digest of that step when the
  run has one).

They run in a run whose journal holds an ``integrity`` event: one with ``policy.integrity`` or a
corruption fault.
"""

from __future__ import annotations

from typing import Any

from testbed.report.check_result import FAIL, PASS, CheckResult, Events, judge, of
from testbed.scenario.expect import Expect


def _main(events: Events) -> Events:
    return [e for e in events if e.get("phase") == "main"]


def onsets(events: Events) -> dict[str, dict[str, Any]]:
    """Each corruption fault's first strike in the main phase: its rank, step, where and how, and
    the index of its event in the journal."""
    found: dict[str, dict[str, Any]] = {}
    for i, e in enumerate(events):
        for rank, hits in sorted(_struck_in(e).items(), key=lambda kv: int(kv[0])):
            for h in hits:
                if h["fault"] not in found:
                    how = f"bias {h['bias']:+g}" if "bias" in h else f"bits {h['bits']}"
                    found[h["fault"]] = {
                        **({"link": _link_of(h)} if h["where"] == "payload" else {}),
                        "fault": h["fault"],
                        "rank": int(rank),
                        "step": int(e["step"]),
                        "where": h["where"],
                        "how": how,
                        "at": i,
                    }
    return found


def _struck_in(e: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What corruptions changed, by rank, in a main-phase step that ended, or in one that failed
    because a corrupted value crashed a later operation (a device fault)."""
    if e.get("event") == "step_end" and e.get("phase") == "main":
        return dict(e.get("sdc", {}))
    if e.get("event") == "failure_detected" and e.get("phase") == "main":
        return {r: err["sdc"] for r, err in e.get("errors", {}).items() if err.get("sdc")}
    if e.get("event") == "job_failed" and e.get("sdc"):
        return {str(e.get("rank")): list(e["sdc"])}
    return {}


def _crashes(events: Events) -> list[tuple[int, dict[str, Any]]]:
    """The failures a corrupted value caused, each as a detection that names the crashed ranks: the
    crash is how the corruption was found."""
    found = []
    for i, e in enumerate(events):
        crashed = [int(r) for r in _struck_in(e)] if e.get("event") != "step_end" else []
        if crashed:
            found.append((i, {"step": int(e.get("step", 0)), "detector": "device_fault", "ranks": crashed}))
    return found


def _link_of(hit: dict[str, Any]) -> list[int]:
    """The link ``[src, dst]`` of a payload's corruption (its tensor is named ``payload src->dst``)."""
    src, dst = str(hit["tensor"]).split()[-1].split("->")
    return [int(src), int(dst)]


def culprits(e: dict[str, Any]) -> set[int]:
    """The ranks whose own NPU corrupted something in a step (a payload's corruption is its link's)."""
    return {
        int(r)
        for r, hits in e.get("sdc", {}).items()
        if any(not h.get("caught") and h["where"] != "payload" for h in hits)
    }


def struck(e: dict[str, Any], caught: bool = False) -> set[int]:
    """The ranks a step's corruption struck: those it changed (or, with ``caught``, those whose
    corrupted payload a checksum caught and had sent again, which changed nothing)."""
    return {
        int(r) for r, hits in e.get("sdc", {}).items() if any(bool(h.get("caught")) == caught for h in hits)
    }


def check_sdc_detected(events: Events, expect: Expect) -> CheckResult:
    """Every corruption was detected, each within the bound on its latency in steps: by the first
    detection after its onset that blames its rank, its link, or no one (a detection that blames
    another rank found another corruption)."""
    truth = onsets(events)
    detections = [
        (i, e) for i, e in enumerate(events) if e.get("event") == "sdc_detected" and e.get("phase") == "main"
    ]
    detections = sorted(detections + _crashes(events), key=lambda d: d[0])
    rows = []
    for f in truth.values():  # a crash is its corruption's onset and detection at once
        seen = next(((i, d) for i, d in detections if i >= f["at"] and _may_be(d, f)), None)
        row = {k: v for k, v in f.items() if k != "at"}
        if seen is not None:
            row.update(
                detected_at=seen[1]["step"],
                latency=int(seen[1]["step"]) - f["step"],
                detector=seen[1]["detector"],
            )
        rows.append(row)
    missed = [r for r in rows if "latency" not in r]
    bound = expect.max_detection_steps
    late = [r for r in rows if bound is not None and r.get("latency", -1) > bound]
    evidence: dict[str, Any] = {"corruptions": rows, "max_detection_steps": bound, **_costs(events)}
    if not truth:
        return judge("sdc_detected", True, expect.sdc_detected, "no silent corruption struck", evidence)
    parts = [f"{len(rows) - len(missed)} of {len(rows)} corruption(s) detected"]
    if missed:
        m = missed[0]
        parts.append(
            f"missed: {m['fault']} ({m['where']}, {m['how']}) on rank {m['rank']} from step {m['step']}"
        )
    lat = [r["latency"] for r in rows if "latency" in r]
    if lat:
        parts.append(
            f"latency {min(lat)}..{max(lat)} step(s)" + (f" (bound {bound})" if bound is not None else "")
        )
    if late:
        parts.append(f"{late[0]['fault']} detected {late[0]['latency']} steps after its onset, past {bound}")
    parts.append(f"detectors took {evidence['integrity_share'] * 100:.3g}% of the run's virtual time")
    return judge("sdc_detected", not missed and not late, expect.sdc_detected, "; ".join(parts), evidence)


def _may_be(detection: dict[str, Any], onset: dict[str, Any]) -> bool:
    """Whether ``detection`` may have found the corruption of ``onset``: it blames its rank (the
    receiver, for a payload), a link into that rank, or no one."""
    blamed, links = detection.get("ranks") or [], detection.get("links") or []
    if links:
        return any(int(b) == onset["rank"] for _, b in links)
    ends = {onset["rank"], *onset.get("link", [])}  # a payload's: either end of its link
    return not blamed or bool(ends & set(blamed))


def _costs(events: Events) -> dict[str, Any]:
    """The detectors' virtual time, the run's, and how deep each rollback went."""
    checks = of(events, "integrity_check", "main")
    spent = sum(float(e["t"]) - float(e["t_start"]) for e in checks)
    end = next(iter(of(events, "phase_end", "main")), None)
    total = (
        float(end["t"]) if end else max((float(e["t"]) for e in of(events, "step_end", "main")), default=0.0)
    )
    depth = []
    last = None
    for e in _main(events):
        if e["event"] == "sdc_detected":
            last = int(e["step"])
        elif e["event"] == "resume" and last is not None:
            depth.append(last - int(e["from_step"]))
            last = None
    return {
        "integrity_s": spent,
        "integrity_share": spent / total if total > 0 else 0.0,
        "rollback_depth_steps": depth,
    }


def _blamed(events: Events) -> list[dict[str, Any]]:
    """Each detection with the truth it is scored on: ``truth``, the ranks whose own NPU corrupted the
    state it held then (a payload's corruption is its link's: no NPU is to blame), and
    ``corrupted``, whether any rank's state held a corruption (or a checksum caught one).

    A strike corrupts its rank's state; a checkpoint keeps what its state held; a resume takes the
    restored checkpoint's; a rollback to a clean checkpoint clears it; a replayed step whose replay
    is kept undoes its first run (the kept run's own strikes count)."""
    out = []
    held: set[int] = set()
    kept: dict[int, set[int]] = {}
    before: dict[int, set[int]] = {}  # step -> what the state held as its latest run began
    caught: set[int] = set()  # the receivers of payloads a checksum caught in the last step
    npus: set[int] = set()  # the ranks whose NPU corrupted something itself (not a link into it)
    replayed = None
    for e in _main(events):
        if e["event"] == "step_end":
            if int(e["step"]) != replayed:  # the kept run of a replay began where the first run did
                before[int(e["step"])] = set(held)
            replayed = None
            held |= struck(e)
            npus |= culprits(e)
            caught = struck(e, caught=True)
        elif e["event"] == "sdc_replay":  # the step's replay is kept: its first run never happened
            replayed = int(e["step"])
            held = set(before.get(replayed, held))
        elif e["event"] == "checkpoint_committed":
            kept[int(e["step"])] = set(held)
        elif e["event"] == "resume":
            held = set(kept.get(int(e["from_step"]), set())) if e.get("checkpoint", True) else set()
        elif e["event"] == "sdc_detected":
            cured = caught if e.get("detector") == "payload_checksum" else set()
            row = {
                "step": int(e["step"]),
                "truth": sorted((held & npus) | cured),
                "corrupted": bool(held | cured),
                "blamed": list(e["ranks"]),
            }
            out.append({**row, "links": [list(k) for k in e.get("links") or []]})
    return out


def check_sdc_attribution(events: Events, expect: Expect) -> CheckResult:
    """Whom each detection blamed against who was corrupted; a healthy NPU blamed or excluded fails."""
    rows = _blamed(events)
    matrix: dict[str, dict[str, int]] = {}
    wrong = []
    for r in rows:
        truth = [str(x) for x in r["truth"]] or ["none"]
        blamed = [str(x) for x in r["blamed"]] or [f"link {a}->{b}" for a, b in r["links"]] or ["undecided"]
        for t in truth:
            for b in blamed:
                matrix.setdefault(t, {}).setdefault(b, 0)
                matrix[t][b] += 1
        wrong += [(r["step"], b) for b in r["blamed"] if b not in r["truth"]]
    excluded = [(int(e["step"]), r) for e in of(events, "npu_excluded", "main") for r in e["ranks"]]
    truth_ranks = {f["rank"] for f in onsets(events).values()}
    healthy_out = [(s, r) for s, r in excluded if r not in truth_ranks]
    evidence = {"confusion": matrix, "detections": rows, "excluded": excluded}
    undecided = sum(1 for r in rows if not r["blamed"] and not r["links"])
    linked = sum(1 for r in rows if r["links"])
    if not rows:
        return CheckResult("sdc_attribution", PASS, "no detection to attribute", evidence)
    parts = [f"{len(rows) - undecided - linked} of {len(rows)} detection(s) named a rank"]
    if linked:
        parts.append(f"{linked} named a link")
    if undecided:
        parts.append(f"{undecided} could not tell which replica was wrong")
    if excluded:
        parts.append("excluded " + ", ".join(f"rank {r} at step {s}" for s, r in excluded))
    if wrong:
        parts.append(f"blamed healthy rank {wrong[0][1]} at step {wrong[0][0]}")
    if healthy_out:
        parts.append(f"excluded healthy rank {healthy_out[0][1]} at step {healthy_out[0][0]}")
    status = FAIL if wrong or healthy_out else PASS
    return CheckResult("sdc_attribution", status, "; ".join(parts), evidence)


def check_sdc_false_alarms(events: Events, expect: Expect) -> CheckResult:
    """Detections while no rank's state held a corruption, per 1,000 steps run."""
    rows = [r for r in _blamed(events) if not r["corrupted"]]
    steps = len(of(events, "step_end", "main"))
    rate = 1000.0 * len(rows) / steps if steps else 0.0
    bound = expect.max_false_alarms if expect.max_false_alarms is not None else 0.0
    evidence = {"false_alarms": rows, "steps": steps, "per_1000_steps": rate, "bound": bound}
    summary = f"{len(rows)} false alarm(s) in {steps} steps ({rate:.3g} per 1,000 steps; bound {bound:g})"
    if rows:
        summary += f"; first at step {rows[0]['step']}"
    return CheckResult("sdc_false_alarms", PASS if rate <= bound else FAIL, summary, evidence)


def tainted_checkpoints(events: Events) -> dict[int, int | None]:
    """For each checkpoint committed in the main phase, the onset step of a corruption its state held
    (None: clean), following the journal: a strike taints the state, a resume takes the restored
    checkpoint's taint, a kept replay undoes its step's first run."""
    taint: int | None = None
    by_step: dict[int, int | None] = {}
    before: dict[int, int | None] = {}
    replayed = None
    for e in _main(events):
        if e["event"] == "step_end":
            if int(e["step"]) != replayed:
                before[int(e["step"])] = taint
            replayed = None
        if e["event"] == "step_end" and struck(e) and taint is None:
            taint = int(e["step"])
        elif e["event"] == "sdc_replay":
            replayed = int(e["step"])
            taint = before.get(replayed, taint)
        elif e["event"] == "checkpoint_committed":
            by_step[int(e["step"])] = taint
        elif e["event"] == "resume":
            taint = by_step.get(int(e["from_step"])) if e.get("checkpoint", True) else None
    return by_step


def check_no_poisoned_resume(events: Events, expect: Expect) -> CheckResult:
    """No resume of the main phase restored a checkpoint written after an undetected, undone onset."""
    taint = tainted_checkpoints(events)
    reference = {int(e["step"]): e["digest"] for e in of(events, "step_end", "reference")}
    digest_at: dict[int, str] = {}
    written: dict[int, str] = {}
    rows = []
    for e in _main(events):
        if e["event"] == "step_end":
            digest_at[int(e["step"])] = e["digest"]
        elif e["event"] == "checkpoint_committed" and int(e["step"]) in digest_at:
            written[int(e["step"])] = digest_at[int(e["step"])]
        elif (
            e["event"] == "resume"
            and e.get("checkpoint", True)
            and e.get("source", "checkpoint") == "checkpoint"
        ):
            s = int(e["from_step"])
            row: dict[str, Any] = {"from_step": s, "onset": taint.get(s), "verified": e.get("verified")}
            if s in reference and s in written:
                row["equals_uninterrupted"] = written[s] == reference[s]
            row["poisoned"] = row.get("equals_uninterrupted") is False or (
                "equals_uninterrupted" not in row and row["onset"] is not None
            )
            rows.append(row)
    poisoned = [r for r in rows if r["poisoned"]]
    evidence = {"resumes": rows}
    if not rows:
        return CheckResult("no_poisoned_resume", PASS, "no resume from a checkpoint", evidence)
    if poisoned:
        p = poisoned[0]
        why = f"written after the corruption of step {p['onset']}" if p["onset"] is not None else "its state"
        same = " differs from the uninterrupted run's" if p.get("equals_uninterrupted") is False else ""
        summary = f"resumed from the checkpoint of step {p['from_step']}, {why}{same}: a poisoned resume"
        return CheckResult("no_poisoned_resume", FAIL, summary, evidence)
    return CheckResult(
        "no_poisoned_resume",
        PASS,
        f"{len(rows)} resume(s), each from a checkpoint free of corruption",
        evidence,
    )


#: the integrity checks, in the order a report lists them
INTEGRITY = (
    ("sdc_detected", check_sdc_detected),
    ("sdc_attribution", check_sdc_attribution),
    ("sdc_false_alarms", check_sdc_false_alarms),
    ("no_poisoned_resume", check_no_poisoned_resume),
)
