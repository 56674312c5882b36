"""The summary's table of faults: when, what, target, how each was detected and recovered from.

A pure function of the journal. Each fault that fired in the main phase is
matched to the first recovery not yet claimed whose failed step is at or after
the fault's step (and, for a fault that heals, before it healed), preferring a
failure whose lost ranks are the fault's. A fault no failure followed (a
straggler, a stall, a link that came back in time) reads "none" with the step
it healed at, if it did.
"""

from __future__ import annotations

from typing import Any

#: how the summary names a point of a step
POINT_NAMES = {
    "boundary": "boundary",
    "step.start": "boundary",
    "forward": "forward",
    "backward": "backward",
    "allreduce.mid": "mid-allreduce",
    "shard.mid": "mid-checkpoint",
}
#: the parts of a recovery's breakdown, in the order they happen
BREAKDOWN_ORDER = (
    "detect_s",
    "restart_s",
    "spare_s",
    "relink_s",
    "load_s",
    "hold_s",
    "interval_s",
    "recompute_s",
)


def _target(f: dict[str, Any]) -> str:
    p = f.get("params", {})
    ranks = p.get("ranks")
    if ranks is None and f.get("rank", -1) >= 0:
        ranks = [f["rank"]]
    if ranks:
        return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)
    links = p.get("links") or []
    if links:
        shown = ", ".join(f"{a}->{b}" if b >= 0 else f"rank {a}" for a, b in links[:2])
        return shown + (f" +{len(links) - 2}" if len(links) > 2 else "")
    return "storage" if str(f.get("kind", "")).startswith(("storage", "io_")) else "-"


def _when(f: dict[str, Any]) -> str:
    where = POINT_NAMES.get(f.get("point", "boundary"), f.get("point", ""))
    timed = f.get("params", {}).get("at_time") or f.get("params", {}).get("t_arrival")
    at = f" (t>={timed:.4g}s)" if timed is not None else ""
    return f"step {f.get('step', '?')} {where}{at}"


def recovered_how(r: dict[str, Any]) -> str:
    """A recovery in a few words: its strategy and where training went on from."""
    resumed = f"from step {r['resume_step'] - 1}"
    where = {
        "restart": resumed,
        "hot_spare": resumed,
        "replica": f"from the in-memory replica of step {r['resume_step'] - 1}",
        "elastic": "with the data-parallel replica dropped",
        "step_retry": "of the step",
    }.get(r["strategy"], "of the collective")
    return f"{r['strategy']} {where}"


def _breakdown(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    return f"{r['total_s']:.4g} s = " + " + ".join(
        f"{k[:-2]} {b[k]:.3g}" for k in BREAKDOWN_ORDER if b.get(k)
    )


#: kinds that slow a job down but cannot fail it by themselves
SLOW_ONLY = frozenset({"straggler", "data_stall", "io_saturation"})


def fault_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per fault fired in the main phase, with the failure and recovery it led to."""
    main = [e for e in events if e.get("phase") == "main"]
    fired = [e for e in main if e.get("event") == "fault_injected"]
    failures = [e for e in main if e.get("event") == "failure_detected"]
    recoveries = [e for e in main if e.get("event") == "recovery_complete"]
    healed = {e["id"]: e for e in main if e.get("event") == "fault_healed"}
    led_to = _attribute(fired, failures, recoveries, healed)
    rows = []
    for i, f in enumerate(fired):
        row = {"id": f.get("id", "?"), "when": _when(f), "what": f.get("kind", "?"), "target": _target(f)}
        if "skipped" in f.get("record", {}):
            rows.append({**row, "detected": "-", "recovered": "skipped: " + f["record"]["skipped"]})
        elif i not in led_to:
            after = "healed" if f.get("id") in healed else "no failure followed"
            rows.append({**row, "detected": "none", "recovered": after})
        else:
            r = recoveries[led_to[i]]
            detect = r["breakdown"].get("detect_s")
            rows.append(
                {
                    **row,
                    "detected": r["detected_by"] + (f" after {detect:.3g} s" if detect is not None else ""),
                    "recovered": recovered_how(r),
                    "breakdown": _breakdown(r),
                    "lost": _failure(failures, r).get("dead", []),
                    "recovery": led_to[i],
                }
            )
    return rows


def _attribute(
    fired: list[dict[str, Any]],
    failures: list[dict[str, Any]],
    recoveries: list[dict[str, Any]],
    healed: dict[str, dict[str, Any]],
) -> dict[int, int]:
    """fault index -> recovery index: first the faults whose ranks were lost, then (by step) the
    others that can fail a job, each to the first recovery left at or after its step (and before it
    healed)."""
    claimed: dict[int, int] = {}

    def candidates(i: int) -> list[int]:
        f, heal = fired[i], healed.get(fired[i].get("id", ""))
        return [
            j
            for j, r in enumerate(recoveries)
            if j not in claimed.values()
            and r["fail_step"] >= f.get("step", 0)
            and (heal is None or _failure(failures, r).get("t", 0.0) <= heal["t"])
        ]

    live = [i for i, f in enumerate(fired) if "skipped" not in f.get("record", {})]
    for i in live:
        ranks = set(fired[i].get("params", {}).get("ranks") or [])
        if fired[i].get("rank", -1) >= 0:
            ranks.add(fired[i]["rank"])
        lost = [j for j in candidates(i) if ranks & set(_failure(failures, recoveries[j]).get("dead", []))]
        if lost:
            claimed[i] = lost[0]
    for i in live:
        if i not in claimed and fired[i].get("kind") not in SLOW_ONLY:
            left = candidates(i)
            if left:
                claimed[i] = left[0]
    return claimed


def _failure(failures: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, Any]:
    return next((x for x in failures if x["step"] == r["fail_step"]), {})


COLUMNS = ("when", "what", "target", "detected", "recovered", "breakdown")


def render_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as an aligned text table (a header and one line per fault)."""
    if not rows:
        return []
    cells = [[str(r.get(c, "")) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    line = "  " + "  ".join(f"{{:{w}}}" for w in widths)
    return [line.format(*COLUMNS).rstrip()] + [line.format(*row).rstrip() for row in cells]
