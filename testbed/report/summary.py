"""The one-screen summary printed at the end of a run, rendered from the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.core.units import format_flops
from testbed.report.against_estimate import render as render_against
from testbed.report.fault_rows import BREAKDOWN_ORDER, recovered_how, render_table
from testbed.report.netem_counts import render as render_netem
from testbed.report.serving_report import render as render_serving

_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def _recovery_line(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    parts = ", ".join(f"{k[:-2]} {b[k]:.4g}" for k in BREAKDOWN_ORDER if k in b)
    where = recovered_how(r)
    return (
        f"  step {r['fail_step']}: {where}, detected by "
        f"{r['detected_by']}; {r['total_s']:.4g} s virtual ({parts}); {r['wall_recovery_s']:.2f} s wall"
    )


def _memory_events_line(events: list[dict[str, Any]]) -> list[str]:
    if not events:
        return []
    compactions = [e for e in events if e["action"] == "defragment"]
    borrows = [e for e in events if e["action"] == "borrow"]
    return [
        f"memory policy acted {len(events)} time(s): {len(compactions)} defragmentation(s) moving "
        f"{sum(e['bytes_moved'] for e in compactions) / 2**20:.2f} MiB, {len(borrows)} borrow(s) of "
        f"{sum(e['bytes'] for e in borrows) / 2**20:.2f} MiB from the supernode pool (first at step "
        f"{events[0]['step']}, rank {events[0]['rank']})"
    ]


def _declared_line(d: dict[str, Any] | None) -> list[str]:
    """What the scenario declares, when it declares more than a pass, and whether the run came to it."""
    if not d or d["verdict"] == "pass":  # a scenario meant to pass that fails says so in its verdict
        return []
    what = d["verdict"].upper() + (f" of {', '.join(d['fails'])}" if d["fails"] else "")
    if d["as_declared"]:
        return [f"declared: {what}; as declared (the scenario demonstrates this failure)"]
    return [f"declared: {what}; NOT as declared: {d['why']}"]


def _training(report: dict[str, Any]) -> list[str]:
    """Steps, step time, the estimate, hotspot, faults, recoveries and memory of a training run."""
    lines: list[str] = []
    steps, loss = report["steps"], report["loss"]
    vt = report.get("virtual_time_s")
    lines.append(
        f"steps: {steps['completed']}/{steps['planned']} ({steps['run']} run, recomputed ones included)"
        + (f"   loss: {loss['first']:.4f} -> {loss['last']:.4f}" if loss["first"] is not None else "")
        + (f"   virtual time: {vt:.3f} s" if vt is not None else "")
        + (f"   wall: {report['wall_s']:.1f} s" if report.get("wall_s") is not None else "")
    )
    lines.extend(f"warning: {w}" for w in report.get("warnings") or [])
    st = report.get("step_time")
    if st:
        lines.append(
            f"layout {report['layout']}: a typical step (median; slowest rank) computes "
            f"{st['compute_s']:.3g} s, waits {st['comm_wait_s']:.3g} s on collectives and "
            f"{st['bubble_s']:.3g} s in the pipeline bubble; {format_flops(st['flops'])} per step in all"
        )
    if report.get("against_estimate"):
        lines.extend(render_against(report["against_estimate"]))
    hot = report.get("hotspot") or {}
    if hot.get("verdict") not in (None, "none") and hot.get("steps"):
        lines.append(f"hotspot: {hot['message']}")
    rows = report.get("fault_table") or []
    lines.append(f"faults: {len(rows)} fired in training (breakdowns in virtual seconds)")
    lines.extend(render_table(rows))
    lines.extend(render_netem(report.get("netem") or []))
    recoveries = [r for r in report["recoveries"] if r.get("phase", "main") == "main"]
    wall = sum(r["wall_recovery_s"] for r in recoveries)
    other = [r for j, r in enumerate(recoveries) if j not in {row.get("recovery") for row in rows}]
    lines.append(
        f"recoveries: {len(recoveries)} ({wall:.2f} s wall in all)"
        + (f"; {len(other)} not caused by a planned fault:" if other else "")
    )
    lines.extend(_recovery_line(r) for r in other)
    memory = report.get("memory_trend") or []
    if memory:
        peak = max(memory, key=lambda m: m["fragmentation"])
        shown = ", ".join(
            f"{m['step']}: {m['fragmentation']:.2f}" for m in memory[:: max(1, len(memory) // 8)]
        )
        lines.append(
            f"memory fragmentation (max over ranks, by step): {shown}; peak {peak['fragmentation']:.2f} "
            f"at step {peak['step']}"
        )
    lines.extend(_memory_events_line(report.get("memory_events") or []))
    return lines


def _refused_line(refused: list[dict[str, Any]]) -> list[str]:
    """A warning when the run's listeners refused a connection: someone reached the run's ports."""
    if not refused:
        return []
    first = refused[0]
    listeners = len({r["listener"] for r in refused})
    return [
        f"security: {len(refused)} connection(s) refused on {listeners} listener(s); the first, from "
        f"{first['peer']} on the {first['listener']}: {first['reason']} (peer_refused in the journal)"
    ]


def render(report: dict[str, Any]) -> str:
    """Verdict, seed, steps, faults, recovery breakdown, checks, where the files are, how to replay."""
    lines = [
        f"verdict: {report['verdict'].upper()} (exit {report['exit_code']})   scenario: {report['scenario']}"
        f"   seed: {report['seed']}"
        + (f"   plan: {report['plan_sha256'][:12]}" if report.get("plan_sha256") else ""),
    ]
    if report.get("error"):
        lines.append(f"error: {report['error']}")
    lines.extend(_refused_line(report.get("refused_peers") or []))
    serving = report.get("serving")
    if not serving or report["steps"]["run"]:  # training, alone or beside serving
        lines.extend(_training(report))
    else:
        lines.extend(f"warning: {w}" for w in report.get("warnings") or [])
    if serving:
        lines.extend(render_serving(serving))
    lines.append("checks:")
    for c in report["checks"]:
        lines.append(f"  {_MARK.get(c['status'], c['status']):7} {c['name']}: {c['summary']}")
    lines.extend(_declared_line(report.get("declared")))
    lines.append(f"journal: {report['journal']}")
    lines.append(f"page: {Path(str(report['journal'])).with_name('report.html')} (open it in a browser)")
    replay = report.get("replay") or f"testbed run {report['file']} --seed {report['seed']}"
    lines.append(f"replay: {replay}")
    return "\n".join(lines)
