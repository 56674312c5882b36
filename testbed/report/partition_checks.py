"""The partition checks, as pure functions of the journal.

A partition cuts some supernodes off from the rest until it heals
(``fault_injected`` of kind ``partition``, its window in ``record.t0`` and
``record.t_end``). Two things must hold whatever the recovery does:

- ``one_history``: a step id has one parameter state, ever. Every
  ``step_end`` of the main phase for a step (the first run of it, each
  recomputation after a restart) carries the same parameter digest, and so
  does every write of that step that reached storage from a process that
  was cut off (``zombie_write`` with ``landed: true``). Two digests for one
  step are two histories: a resume from that step depends on which one it
  reads.
- ``heal_progress``: once the partition heals, a step of the main phase ends
  within one exec timeout (the attempt in flight at the heal times out),
  one restart, the longest link setup, the longest load and the longest
  step.
- ``zombies_fenced``: no process the controller gave up while it was cut off
  (a zombie) had a commit land once it could reach the storage again
  (``zombie_write``); ``unknown`` when no zombie wrote.

They run when the journal holds a partition; ``zombies_fenced`` when one of
them cut the controller off (``cuts_control``).
"""

from __future__ import annotations

from typing import Any

from faults.partition import fired
from testbed.report.check_result import FAIL, PASS, UNKNOWN, CheckResult, Events, of
from testbed.scenario.expect import Expect


def histories(events: Events) -> dict[int, dict[str, list[str]]]:
    """Per step of the main phase: each parameter digest seen for it, and where each was seen."""
    seen: dict[int, dict[str, list[str]]] = {}
    for e in of(events, "step_end", "main"):
        if e.get("digest"):
            where = f"step_end seq {e['seq']}"
            seen.setdefault(int(e["step"]), {}).setdefault(str(e["digest"]), []).append(where)
    for e in of(events, "zombie_write"):
        if e.get("landed") and e.get("digest"):
            where = f"rank {e['rank']}'s cut-off process (seq {e['seq']})"
            seen.setdefault(int(e["step"]), {}).setdefault(str(e["digest"]), []).append(where)
    return seen


def check_one_history(events: Events, expect: Expect) -> CheckResult:
    """One parameter digest per step id, over every run of the step and every write that landed."""
    seen = histories(events)
    if not seen:
        return CheckResult("one_history", UNKNOWN, "no step of the main phase ended: nothing to compare", {})
    forked = {step: by for step, by in sorted(seen.items()) if len(by) > 1}
    again = sum(1 for by in seen.values() for where in by.values() if len(where) > 1)
    evidence: dict[str, Any] = {"steps": len(seen), "seen_more_than_once": again}
    if forked:
        step, by = next(iter(forked.items()))
        evidence["forked"] = {str(s): {d[:12]: w for d, w in b.items()} for s, b in list(forked.items())[:5]}
        first = "; ".join(f"{d[:12]} by {', '.join(w[:2])}" for d, w in by.items())
        return CheckResult(
            "one_history",
            FAIL,
            f"{len(forked)} step(s) have two histories; step {step}: {first}",
            evidence,
        )
    return CheckResult(
        "one_history",
        PASS,
        f"one parameter digest for each of {len(seen)} step(s) ({again} seen more than once agree)",
        evidence,
    )


def check_heal_progress(events: Events, expect: Expect) -> CheckResult:
    """After each partition heals, a main-phase step ends within the bound."""
    healing = [p for p in fired(events) if (p.get("record") or {}).get("t_end") is not None]
    if not healing:
        return CheckResult("heal_progress", UNKNOWN, "no partition heals in this run: nothing to judge", {})
    start = next((e for e in events if e.get("event") == "run_start"), {})
    exec_s = float((start.get("timeouts") or {}).get("exec_s", 0.0))
    ends = of(events, "step_end", "main")
    longest_step = max((float(e["t"]) - float(e["t_start"]) for e in ends if "t_start" in e), default=0.0)
    parts = [r.get("breakdown") or {} for r in of(events, "recovery_complete", "main")]
    restart = max((float(b.get("restart_s", b.get("spare_s", 0.0))) for b in parts), default=0.0)
    load = max((float(b.get("load_s", 0.0)) for b in parts), default=0.0)
    setup = max((float(g.get("setup_s", 0.0)) for g in of(events, "group_open")), default=0.0)
    # the attempt in flight at the heal times out, then one restart, link setup, load and step
    bound = exec_s + restart + setup + load + longest_step
    rows = []
    for p in healing:
        t_heal = float(p["record"]["t_end"])
        after = [float(e["t"]) for e in ends if float(e["t_start"] if "t_start" in e else e["t"]) >= t_heal]
        rows.append({"fault": p["id"], "t_heal": t_heal, "next_step_t": min(after, default=None)})
    evidence = {"bound_s": bound, "exec_s": exec_s, "partitions": rows}
    stuck = [r for r in rows if r["next_step_t"] is None]
    if stuck:
        return CheckResult(
            "heal_progress",
            FAIL,
            f"no step of the main phase ended after {stuck[0]['fault']} healed at "
            f"t={stuck[0]['t_heal']:.3f} s",
            evidence,
        )
    lags = [r["next_step_t"] - r["t_heal"] for r in rows]
    worst = max(lags)
    summary = (
        f"a step ended {worst:.3f} s after the heal at the latest (bound {bound:.3f} s: exec timeout "
        f"{exec_s:g} s + restart {restart:g} s + link setup {setup:.3f} s + load {load:.3g} s + longest "
        f"step {longest_step:.3f} s)"
    )
    return CheckResult("heal_progress", PASS if worst <= bound else FAIL, summary, evidence)


def check_zombies_fenced(events: Events, expect: Expect) -> CheckResult:
    """Every commit a cut-off, replaced process tried after the heal was refused."""
    writes = of(events, "zombie_write")
    if not writes:
        return CheckResult("zombies_fenced", UNKNOWN, "no cut-off process tried to write: nothing judged", {})
    tried = [
        {k: w.get(k) for k in ("rank", "step", "epoch", "landed", "refused", "path", "error")} for w in writes
    ]
    landed = [w for w in writes if w.get("landed")]
    if landed:
        first = landed[0]
        return CheckResult(
            "zombies_fenced",
            FAIL,
            f"{len(landed)} of {len(writes)} commit(s) from cut-off processes landed; rank {first['rank']}'s "
            f"step {first['step']} (epoch {first.get('epoch')}) at {first.get('path')}",
            {"writes": tried},
        )
    return CheckResult(
        "zombies_fenced",
        PASS,
        f"all {len(writes)} commit(s) from cut-off processes were refused: {writes[0].get('refused')}",
        {"writes": tried},
    )


#: the partition checks, in the order a report lists them
PARTITION = (
    ("one_history", check_one_history),
    ("heal_progress", check_heal_progress),
    ("zombies_fenced", check_zombies_fenced),
)


def partition_checks(events: Events) -> tuple[tuple[str, Any], ...]:
    """The partition checks, if the journal holds a partition; ``zombies_fenced`` only if one of them
    cut the controller off (``cuts_control``): without, no process is ever given up."""
    cuts = fired(events)
    if not cuts:
        return ()
    zombies = any((p.get("params") or {}).get("cuts_control") for p in cuts)
    return PARTITION if zombies else PARTITION[:2]
