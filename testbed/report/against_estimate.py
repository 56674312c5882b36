"""The run beside its estimate: each part of a typical step, and the checkpoint write, from the journal.

The ``job`` event holds what ``testbed estimate`` computed with nothing
started; the main phase's ``step_end`` and ``checkpoint_committed`` events
hold what the run took. A typical step is the median over steps (the first
step's link set-up and a recovery's re-run stay out of it); its parts are
those of the lowest rank (rank 0: the first pipeline stage of the first
replica, whose groups the estimate times; in a pipeline the other stages
wait in their collectives for what the first stage sees as its bubble). A
part within :data:`TOLERANCE` agrees; one outside it is named with its cause
where the testbed knows one, and as unexplained otherwise. A pipelined proxy
waits the job's pipeline (:mod:`testbed.job.pipeline`, the ``job`` event's
``pipeline: job``); a journal written before runs did so timed the proxy's
own, whose bubble is named as the cause.
"""

from __future__ import annotations

import statistics
from typing import Any

Events = list[dict[str, Any]]

#: How far a part of the run may be from the estimate and still agree with it.
TOLERANCE = 0.05


def _row(part: str, estimate: float, run: float | None, why: str = "") -> dict[str, Any]:
    if run is None:
        return {"part": part, "estimate_s": estimate, "run_s": None, "ratio": None, "agrees": None, "why": ""}
    ratio = run / estimate if estimate > 0 else (1.0 if run == 0 else float("inf"))
    agrees = abs(ratio - 1.0) <= TOLERANCE
    reason = "" if agrees else (why or "not explained: the run and the closed forms disagree")
    return {
        "part": part,
        "estimate_s": estimate,
        "run_s": run,
        "ratio": ratio,
        "agrees": agrees,
        "why": reason,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def against_estimate(events: Events) -> dict[str, Any] | None:
    """Rows (step, compute, collectives, bubble, checkpoint write) of estimate beside run; None
    without a ``job`` event or before any step. The pipeline's sends count with the bubble (a
    stage waits for them in its receives) and the other collectives as the collectives."""
    job = next((e for e in events if e.get("event") == "job" and "estimate" in e), None)
    steps = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    if job is None or not steps:
        return None
    est = job["estimate"]
    writes = [
        float(e["write_s"])
        for e in events
        if e.get("event") == "checkpoint_committed" and e.get("phase") == "main"
    ]
    m_run, m_job = int(job.get("proxy_micro_batches", 1)), int(est["micro_batches"])
    v = int(est.get("virtual_stages", 1))
    whys = []
    own = job.get("pipeline") != "job"  # an older journal: the proxy's own pipeline timed the run
    if own and m_run != m_job:
        whys.append(f"the proxy pipelines {m_run} micro-batches per step, the job {m_job}")
    if own and v > 1:
        whys.append(f"the proxy runs plain 1F1B, the job interleaves {v} model chunks per rank")
    formula = "(p-1)/(v m)" if v > 1 else "(p-1)/m"
    bubble_why = f"{'; '.join(whys)}: the bubble is {formula} of the compute" if whys else ""
    # a stage waits for its input in the pipeline's receives, which the run counts as its bubble
    sends = float(est.get("collectives", {}).get("pp_send", {}).get("seconds", 0.0))
    rows = [
        _row("compute", est["compute_s"], _median([e["compute_s"][0] for e in steps])),
        _row("collectives", est["comm_s"] - sends, _median([e["comm_wait_s"][0] for e in steps])),
        _row("bubble", est["bubble_s"] + sends, _median([e["bubble_s"][0] for e in steps]), bubble_why),
    ]
    parts_why = "follows from the parts above" if any(r["agrees"] is False for r in rows) else ""
    rows.insert(0, _row("step", est["step_s"], _median([e["t"] - e["t_start"] for e in steps]), parts_why))
    rows.append(_row("checkpoint write", est["checkpoint_write_s"], _median(writes)))
    return {"rows": rows, "steps": len(steps), "agrees": all(r["agrees"] is not False for r in rows)}


def render(compared: dict[str, Any]) -> list[str]:
    """The comparison as the summary's lines."""
    out = [f"against the estimate (median of {compared['steps']} steps; the parts at rank 0):"]
    for r in compared["rows"]:
        if r["run_s"] is None:
            out.append(f"  {r['part']:<17} estimate {r['estimate_s']:.4g} s, not run")
            continue
        mark = "agrees" if r["agrees"] else f"DIFFERS: {r['why']}"
        out.append(
            f"  {r['part']:<17} estimate {r['estimate_s']:.4g} s, run {r['run_s']:.4g} s "
            f"({r['ratio']:.3f}x) {mark}"
        )
    return out
