"""Goodput: the share of virtual time that advanced training, and where the rest went, from the journal.

``goodput = useful time / total virtual time`` of the main phase. Every
instant of the phase, ``[0, t_end]``, falls in exactly one category, the
first of these that covers it:

1. ``recovery``: from a failure to the moment training goes on (detection,
   restart, re-link, load; op retry's and step retry's hold and interval),
   ``[t_death, t_resume]`` of each ``recovery_complete``. A retry cures a
   failure *inside* a step: its detection wait and hold are recovery even
   though the step then completes.
2. ``checkpoint``: training held for a checkpoint (its write, or its
   snapshot when asynchronous, and any pause a fault added),
   ``[t_saved, t_resume]`` of each ``checkpoint_committed``; ``integrity``:
   the integrity detectors' reads after a step, ``[t_start, t]`` of each
   ``integrity_check``.
3. ``useful``: the kept run of each step (its last: a recomputed step
   replaces the earlier run), ``[t_start, t]``, counted at the share of
   data-parallel replicas that trained it (an elastic job with replicas
   out did that share of the work; the rest is ``degraded``).
4. ``lost``: step runs that were thrown away (run again after a restart)
   and the part of a failed step before it failed.
5. ``other``: everything else (the first link setup, waits between steps).

So the categories add up to the total, and a retry that took 1842 s of a
2506 s run shows as 1842 s of recovery, not as training.
"""

from __future__ import annotations

import itertools
from typing import Any

Events = list[dict[str, Any]]
Interval = tuple[float, float, str, float]  # start, end, category, weight (the useful share)

#: categories in the order they claim an instant covered by several
PRIORITY = ("recovery", "checkpoint", "integrity", "useful", "lost")


def _intervals(events: Events, kept: dict[int, dict[str, Any]], steps: Events) -> list[Interval]:
    """Every interval of the main phase that belongs to a category."""
    main = [e for e in events if e.get("phase") == "main"]
    out: list[Interval] = []
    for e in main:
        kind = e.get("event")
        if kind == "recovery_complete" and "t_death" in e and "t_resume" in e:
            out.append((float(e["t_death"]), float(e["t_resume"]), "recovery", 1.0))
        elif kind == "checkpoint_committed":
            paused = max((float(v) for v in (e.get("paused") or {}).values()), default=0.0)
            start = float(e.get("t_saved", float(e["t"]) - float(e["write_s"])))
            out.append((start, float(e["t_resume"]) + paused, "checkpoint", 1.0))
        elif kind == "integrity_check":
            out.append((float(e["t_start"]), float(e["t"]), "integrity", 1.0))
        elif kind == "failure_detected" and "t_start" in e:
            out.append((float(e["t_start"]), float(e["t_death"]), "lost", 1.0))
    kept_ids = {id(e) for e in kept.values()}
    for e in steps:
        useful = id(e) in kept_ids
        share = float(e.get("dp_share", 1.0)) if useful else 1.0
        out.append((float(e["t_start"]), float(e["t"]), "useful" if useful else "lost", share))
    return [i for i in out if i[1] > i[0]]


def _measure(intervals: list[Interval], total: float) -> dict[str, float]:
    """Seconds of ``[0, total]`` in each category (``degraded``: the useful intervals' unused share;
    ``other``: covered by none), by a sweep over the intervals' ends."""
    cuts = sorted({0.0, total, *(t for a, b, _, _ in intervals for t in (a, b) if 0.0 < t < total)})
    found = dict.fromkeys((*PRIORITY, "degraded", "other"), 0.0)
    by_start = sorted(intervals)
    active: list[Interval] = []
    k = 0
    for a, b in itertools.pairwise(cuts):
        while k < len(by_start) and by_start[k][0] <= a:
            active.append(by_start[k])
            k += 1
        active = [i for i in active if i[1] > a]
        here = [i for i in active if i[0] <= a and i[1] >= b]
        cats = {i[2] for i in here}
        cat = next((c for c in PRIORITY if c in cats), "other")
        if cat == "useful":
            share = max(i[3] for i in here if i[2] == "useful")
            found["useful"] += (b - a) * share
            found["degraded"] += (b - a) * (1.0 - share)
        else:
            found[cat] += b - a
    return found


def goodput(events: Events) -> dict[str, Any] | None:
    """Goodput of the main phase and where every other second went; None before any step."""
    steps = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    if not steps or "t_start" not in steps[0]:
        return None
    kept: dict[int, dict[str, Any]] = {}
    for e in steps:
        kept[int(e["step"])] = e  # a recomputed step replaces the earlier run of it
    end = next((e for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), None)
    total = float(end["t"]) if end else max(float(e["t"]) for e in steps)
    found = _measure(_intervals(events, kept, steps), total)
    failures = sum(1 for e in events if e.get("event") == "failure_detected" and e.get("phase") == "main")
    return {
        "goodput": found["useful"] / total if total > 0 else 0.0,
        "useful_s": found["useful"],
        "total_s": total,
        "recovery_s": found["recovery"],
        "checkpoint_s": found["checkpoint"],
        "integrity_s": found["integrity"],
        "lost_s": found["lost"],
        "degraded_s": found["degraded"],
        "other_s": found["other"],
        "steps_kept": len(kept),
        "steps_run": len(steps),
        "steps_lost": len(steps) - len(kept) + failures,
        "finished": end is not None,
    }


def describe(g: dict[str, Any]) -> str:
    """The breakdown in words, every category that took time, largest first after training."""
    parts = [
        (g["recovery_s"], "in recovery (detection, restart, re-link, load, retry holds)"),
        (g["lost_s"], f"lost ({g['steps_lost']} step run(s) thrown away or cut short)"),
        (g["checkpoint_s"], "held for checkpoints"),
        (g.get("integrity_s", 0.0), "checking integrity"),
        (g.get("degraded_s", 0.0), "short of data-parallel replicas"),
        (g.get("other_s", 0.0), "other (link setup, waits between steps)"),
    ]
    rest = ", ".join(f"{s:.4g} s {what}" for s, what in sorted(parts, key=lambda p: -p[0]) if s > 0)
    return f"{share(g['goodput'])} of {g['total_s']:.4g} s virtual time trained" + (
        f"; {rest}" if rest else ""
    )


def share(x: float) -> str:
    """A share as a percentage, with the digits that matter when it is small (0.16%, 0.0014%: not 0.0%)."""
    return f"{x:.1%}" if x == 0 or x >= 0.01 else f"{x * 100:.2g}%"
