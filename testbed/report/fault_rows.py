"""The summary's table of faults: when, what, target, what it did, how the failure it caused was
detected and how the recovery went.

A pure function of the journal. Each fault that fired in the main phase says
whether it took effect (:mod:`faults.effects`), and is matched to the first
failure episode not yet claimed that began at or after the fault's step (and,
for a fault that heals, before it healed), preferring one whose lost ranks
are the fault's. An episode is a failure and any retries of it, up to what
ended it: a completed recovery, a failed one (the stage and the error), or
the job's end. A fault no failure followed (a straggler, a stall, a link that
came back in time) reads "none", and "healed" if it did.
"""

from __future__ import annotations

from typing import Any

from faults.effects import fault_effects
from faults.evidence import POINT_NAMES
from faults.kind import kinds
from testbed.recovery.record import how

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


def target_of(f: dict[str, Any]) -> str:
    """What a planned or fired fault acts on, in a few words: its ranks, its links, the storage, or
    (a Poisson process over a selection mode) ranks drawn at each arrival."""
    p = f.get("params", {})
    ranks = p.get("ranks")
    if not ranks and f.get("rank", -1) >= 0:
        ranks = [f["rank"]]
    if ranks:
        return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)
    if p.get("cut"):  # a partition: the supernodes cut off from the rest, and how
        nodes = ",".join(str(s) for s in p["cut"])
        return f"supernode{'s' if len(p['cut']) > 1 else ''} {nodes} cut off ({p.get('direction', 'both')})"
    links = p.get("links") or []
    if links:
        shown = ", ".join(f"{a}->{b}" if b >= 0 else f"rank {a}" for a, b in links[:2])
        return shown + (f" +{len(links) - 2}" if len(links) > 2 else "")
    if "mtbf" in p:
        return f"ranks drawn at each arrival ({_mode(p.get('target', {}))})"
    return "storage" if str(f.get("kind", "")).startswith(("storage", "io_")) else "-"


def _mode(target: dict[str, Any]) -> str:
    where = f" of supernode {target['supernode']}" if "supernode" in target else ""
    value = f" {target['value']}" if "value" in target else ""
    return f"mode {target.get('mode', 'all')}{value}{where}"


def _when(f: dict[str, Any]) -> str:
    where = POINT_NAMES.get(f.get("point", "boundary"), f.get("point", ""))
    timed = f.get("params", {}).get("at_time") or f.get("params", {}).get("t_arrival")
    at = f" (t>={timed:.4g}s)" if timed is not None else ""
    return f"step {f.get('step', '?')} {where}{at}"


def recovered_how(r: dict[str, Any]) -> str:
    """A recovery in a few words: its procedure and where training went on from."""
    return how(r["strategy"], r["resume_step"])


def _breakdown(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    return f"{r['total_s']:.4g} s = " + " + ".join(
        f"{k[:-2]} {b[k]:.3g}" for k in BREAKDOWN_ORDER if b.get(k)
    )


#: the events that end a failure: a recovery that completed or failed, or the run's end
OUTCOMES = ("recovery_complete", "recovery_failed", "job_failed", "run_error", "controller_killed")


def _episodes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The main phase's failures grouped by what ended them (a retry that fails and the restart that
    follows are one episode): its first failure, every rank lost in it, and its outcome event."""
    episodes: list[dict[str, Any]] = []
    open_: dict[str, Any] | None = None
    for e in events:
        name = e.get("event")
        if name == "sdc_detected" and e.get("phase") == "main" and open_ is None:
            # a silent corruption found at a step boundary: the rollback that follows ends it (one
            # cured within the step, a payload sent again, is over already)
            found = {"failure": e, "dead": set(e.get("ranks", [])), "outcome": None, "sdc": True}
            episodes.append(found)
            open_ = None if e.get("cured") else found
        elif name == "failure_detected" and e.get("phase") == "main":
            if open_ is None:
                open_ = {"failure": e, "dead": set(), "outcome": None}
                episodes.append(open_)
            open_["dead"] |= set(e.get("dead", []))
        elif name in OUTCOMES and open_ is not None and e.get("phase", "main") == "main":
            open_["outcome"] = e
            open_ = None
    return episodes


def _outcome(ep: dict[str, Any]) -> dict[str, Any]:
    """How an episode ended, as the table's cells."""
    o = ep["outcome"]
    if o is None and ep.get("sdc"):
        if ep["failure"].get("cured"):
            return {"recovered": "cured in the step: the payload was sent again"}
        return {"recovered": "not rolled back (policy.integrity.on_detect: report)"}
    name = None if o is None else o["event"]
    if name == "recovery_complete":
        return {"recovered": recovered_how(o), "breakdown": _breakdown(o)}
    if name == "recovery_failed":
        error = f"{o['error_type']}: {_first_line(o['error'])}"
        if o["stage"] == "none":
            return {"recovered": f"not attempted: no restart cures {error}"}
        return {"recovered": f"{o['strategy']} failed at {o['stage']}: {error}"}
    if name == "job_failed":
        return {"recovered": f"the job failed: {o['error_type']}: {_first_line(o['error'])}"}
    if name == "controller_killed":
        return {"recovered": "cut short by the controller's loss"}
    if name == "run_error":
        return {"recovered": f"the run ended: {_first_line(o['error'])}"}
    return {"recovered": "not recovered: the run ended first"}


def _first_line(text: str, most: int = 120) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= most else line[: most - 3] + "..."


def _effects(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    journalled = next((e for e in reversed(events) if e.get("event") == "fault_effects"), None)
    if journalled is not None:
        return dict(journalled["effects"])
    return {k: v.as_dict() for k, v in fault_effects(events).items()}


def _effect_cell(effect: dict[str, Any] | None) -> str:
    if effect is None:
        return "-"
    return effect["how"] if effect["took"] else f"NONE: {effect['how']}"


def fault_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per fault fired in the main phase: what it did (or why nothing), and the failure it
    led to, how that was detected and how the recovery went (completed, failed and why, or none)."""
    main = [e for e in events if e.get("phase") == "main"]
    fired = [e for e in main if e.get("event") == "fault_injected"]
    recoveries = [e for e in main if e.get("event") == "recovery_complete"]
    healed = {e["id"]: e for e in main if e.get("event") == "fault_healed"}
    episodes = _episodes(events)
    effects = _effects(events)
    led_to = _attribute(fired, episodes, healed)
    rows = []
    for i, f in enumerate(fired):
        effect = effects.get(f.get("id", ""))
        row = {
            "id": f.get("id", "?"),
            "when": _when(f),
            "what": f.get("kind", "?"),
            "target": target_of(f),
            "effect": _effect_cell(effect),
            "took_effect": None if effect is None else bool(effect["took"]),
        }
        if "skipped" in f.get("record", {}):
            rows.append({**row, "detected": "-", "recovered": "skipped: " + f["record"]["skipped"]})
        elif i not in led_to:
            after = "healed" if f.get("id") in healed else "no failure followed"
            rows.append({**row, "detected": "none", "recovered": after})
        else:
            ep = episodes[led_to[i]]
            first = ep["failure"]
            if ep.get("sdc"):
                lag = int(first["step"]) - int(f.get("step", 0))
                row |= {"detected": f"{first['detector']} at step {first['step']} ({lag} step(s) on)"}
            else:
                detect = float(first["t"]) - float(first["t_death"])
                row |= {
                    "detected": f"{first['detected_by']} after {detect:.3g} s",
                    "lost": sorted(ep["dead"]),
                }
            row |= _outcome(ep)
            if ep["outcome"] is not None and ep["outcome"]["event"] == "recovery_complete":
                row["recovery"] = next(j for j, r in enumerate(recoveries) if r is ep["outcome"])
            rows.append(row)
    return rows


def _attribute(
    fired: list[dict[str, Any]], episodes: list[dict[str, Any]], healed: dict[str, dict[str, Any]]
) -> dict[int, int]:
    """fault index -> failure episode index: first the faults whose ranks were lost, then (by step) the
    others that can fail a job, each to the first episode left at or after its step (and, for a fault
    that heals, begun before it healed). Ranks lost together are one episode of several faults (two
    kills in one step, or a kill during the recovery from another): each of those faults claims it."""
    claimed: dict[int, int] = {}
    registry = kinds()

    def silent(f: dict[str, Any]) -> bool:
        kind = registry.get(str(f.get("kind")))
        return kind is not None and kind.silent

    def candidates(i: int, shared: bool = False) -> list[int]:
        f, heal = fired[i], healed.get(fired[i].get("id", ""))
        return [
            j
            for j, ep in enumerate(episodes)
            if (shared or j not in claimed.values())
            # a corruption is found by a detector, not a failure, unless the value it made crashed
            and (bool(ep.get("sdc")) == silent(f) or _crashed_by(f, ep))
            and ep["failure"]["step"] >= f.get("step", 0)
            and (heal is None or float(ep["failure"].get("t_death", 0.0)) <= float(heal["t"]))
        ]

    live = [i for i, f in enumerate(fired) if "skipped" not in f.get("record", {})]
    for i in live:  # a failure that names the corruption that caused it
        crashed = [j for j in candidates(i) if _crashed_by(fired[i], episodes[j])]
        if crashed:
            claimed[i] = crashed[0]
    for i in live:
        if i in claimed:
            continue
        ranks = set(fired[i].get("params", {}).get("ranks") or [])
        if fired[i].get("rank", -1) >= 0:
            ranks.add(fired[i]["rank"])
        lost = [j for j in candidates(i, shared=True) if ranks & episodes[j]["dead"]]
        if lost:
            claimed[i] = lost[0]
    for i in live:
        kind = registry.get(str(fired[i].get("kind")))
        if i not in claimed and not (kind is not None and kind.slows_only):
            left = candidates(i)
            if left:
                claimed[i] = left[0]
    return claimed


def _crashed_by(fault: dict[str, Any], episode: dict[str, Any]) -> bool:
    """Whether ``episode`` began with a failure that a value corrupted by ``fault`` caused."""
    errors = episode["failure"].get("errors", {}).values()
    return any(h.get("fault") == fault.get("id") for err in errors for h in err.get("sdc", []))


COLUMNS = ("when", "what", "target", "effect", "detected", "recovered", "breakdown")


#: The widest cell of the table; a longer text (a reason, an error) is cut and given in full beneath.
CELL_MAX = 60


def render_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as an aligned text table (a header and one line per fault); a cell longer than
    :data:`CELL_MAX` (but in the last column) is cut with a note number, and the notes follow the
    table in full."""
    if not rows:
        return []
    notes: list[str] = []

    def cell(text: str, last: bool) -> str:
        if len(text) <= CELL_MAX or last:  # the last column needs no room after it
            return text
        notes.append(text)
        mark = f" [{len(notes)}]"
        return text[: CELL_MAX - len(mark) - 3].rstrip() + "..." + mark

    cells = [[cell(str(r.get(c, "")), c == COLUMNS[-1]) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    line = "  " + "  ".join(f"{{:{w}}}" for w in widths)
    table = [line.format(*COLUMNS).rstrip()] + [line.format(*row).rstrip() for row in cells]
    return table + [f"  [{i}] {text}" for i, text in enumerate(notes, 1)]
