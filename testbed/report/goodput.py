"""Goodput: the share of virtual time that advanced training (DESIGN 4.6), from the journal alone.

``goodput = useful step time / total virtual time`` of the main phase, where a
step's useful time is its last (kept) execution, ``t - t_start`` over all
ranks (less any overlap with the step before: a pipeline's first stage
starts the next step before its last stage ends this one). Everything else
is overhead: link setup, checkpoint writes, steps that failed or were run
again, detection, restart, re-link, load.
"""

from __future__ import annotations

from typing import Any

Events = list[dict[str, Any]]


def _useful_s(kept: Events) -> float:
    """Time some rank spent on a kept step: each step from its start, or from the end of the step
    before if that ends later (a pipeline's stages start the next step while the last stage ends
    this one: the overlap counts once), times the share of replicas that trained it (an elastic
    job with replicas out did that share of the work)."""
    useful, t_prev = 0.0, float("-inf")
    for e in sorted(kept, key=lambda e: float(e["t_start"])):
        start, end = max(float(e["t_start"]), t_prev), float(e["t"])
        useful += max(0.0, end - start) * float(e.get("dp_share", 1.0))
        t_prev = max(t_prev, end)
    return useful


def goodput(events: Events) -> dict[str, Any] | None:
    """Goodput of the main phase, and where the rest of the time went; None before any step."""
    steps = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    if not steps or "t_start" not in steps[0]:
        return None
    kept: dict[int, dict[str, Any]] = {}
    for e in steps:
        kept[int(e["step"])] = e  # a recomputed step replaces the earlier run of it
    useful = _useful_s(list(kept.values()))
    end = next((e for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), None)
    total = float(end["t"]) if end else max(float(e["t"]) for e in steps)
    main = [e for e in events if e.get("phase") == "main"]
    recoveries = [e for e in main if e.get("event") == "recovery_complete"]
    return {
        "goodput": useful / total if total > 0 else 0.0,
        "useful_s": useful,
        "total_s": total,
        "checkpoint_s": sum(float(e["write_s"]) for e in main if e.get("event") == "checkpoint_committed"),
        "recovery_s": sum(float(e["total_s"]) for e in recoveries),
        "steps_kept": len(kept),
        "steps_run": len(steps),
        "steps_lost": len(steps) - len(kept) + sum(1 for e in main if e.get("event") == "failure_detected"),
        "finished": end is not None,
    }
