"""The run's timeline as inline SVG: one lane per rank on the virtual clock, every fault's window.

Each lane holds, for every step a rank trained, the step as it ran: its data
wait, each collective in its place (a pipeline receive as bubble) and compute
between them, from the journal's ``step_end.ops``; where the journal does not
keep them (or the page has no room), its time by part (data wait, compute,
communication wait, bubble: ``step_end``'s figures for the rank, one after
another from its start). Across the lanes are the spans every rank spent
outside training (a recovery's detection, restart, re-link, load and
recompute; a failed attempt; a checkpoint hold). Above the lanes, each fault has a row of its own, shaded
from its injection to its heal and labelled; each detection and each recovery
is a marked line across all lanes.

Every shape carries its virtual times in ``data-a`` and ``data-b``, so the
page's script can zoom on time; without the script the SVG is complete as
drawn, and each shape's ``<title>`` names what it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

from testbed.report.timeline_plot import SPANS, spans

Events = list[dict[str, Any]]

#: The parts of a rank's step, in the order drawn, with their colours.
STEP_PARTS = {
    "data_wait_s": ("data wait", "#937860"),
    "compute_s": ("compute", "#4c72b0"),
    "comm_wait_s": ("communication wait", "#dd8452"),
    "bubble_s": ("bubble", "#8172b3"),
}
#: A collective on a rank's lane (a step drawn as it ran).
COLLECTIVE = ("collective", "#dd8452")
#: The most shapes the lanes hold: past it a step is drawn by part rather than as it ran, and past it
#: again as one shape a rank-step (its parts in the title), to keep the page light.
MAX_PART_SHAPES = 12_000
WIDTH, LEFT, RIGHT = 1100, 96, 16
FAULT_ROW, AXIS = 16, 22


@dataclass(frozen=True)
class Shape:
    """One shape of the timeline: its lane (a rank; -1: across all), its span of virtual time, what it is."""

    lane: int
    a: float
    b: float
    kind: str
    colour: str
    title: str


@dataclass(frozen=True)
class FaultWindow:
    """A fault from its injection to its heal (``b == a``: no heal in the journal; it is marked)."""

    fault: str
    kind: str
    label: str
    a: float
    b: float


def _ranks_of(e: dict[str, Any]) -> list[int]:
    n = len(e.get("compute_s") or [])
    ranks = e.get("ranks")
    return [int(r) for r in ranks] if isinstance(ranks, list) and len(ranks) == n else list(range(n))


def _op_shapes(rank: int, step: int, ops: dict[str, Any], data_wait: float, end: float) -> list[Shape]:
    """A rank's step as it ran (``step_end.ops``): its data wait, each collective in its place (a
    pipeline receive as bubble), and compute between them; after the last one kept, if it ran more
    than the journal keeps, the rest is drawn as untraced."""
    t = float(ops["t_start"])
    out: list[Shape] = []
    if data_wait > 0:
        title = f"rank {rank} step {step}: data wait {data_wait:.4g} s"
        out.append(Shape(rank, t, t + data_wait, "data wait", STEP_PARTS["data_wait_s"][1], title))
    t += data_wait
    for name, algo, group, nbytes, a, b in ops["run"]:
        if a > t:
            title = f"rank {rank} step {step}: compute {a - t:.4g} s"
            out.append(Shape(rank, t, a, "compute", STEP_PARTS["compute_s"][1], title))
        kind, colour = ("bubble", STEP_PARTS["bubble_s"][1]) if name == "recv" else COLLECTIVE
        title = f"rank {rank} step {step}: {name} ({algo}, group {group}), {nbytes:,} bytes, {b - a:.4g} s"
        out.append(Shape(rank, a, max(a, b), kind, colour, title))
        t = max(t, b)
    if end > t:
        kind, colour = ("untraced", "#c7c7c7") if ops.get("more") else ("compute", STEP_PARTS["compute_s"][1])
        out.append(Shape(rank, t, end, kind, colour, f"rank {rank} step {step}: {kind} {end - t:.4g} s"))
    return out


def _part_shapes(
    rank: int, step: int, parts: list[tuple[str, float]], start: float, end: float, whole: bool
) -> list[Shape]:
    """A rank's step from its totals by part, one after another from its start (or one shape)."""
    what = ", ".join(f"{STEP_PARTS[k][0]} {v:.4g} s" for k, v in parts if v > 0)
    if whole:
        return [Shape(rank, start, end, "step", "#4c72b0", f"rank {rank} step {step}: {what}")]
    out, t = [], start
    for key, seconds in parts:
        if seconds > 0:
            name, colour = STEP_PARTS[key]
            out.append(
                Shape(
                    rank,
                    t,
                    t + seconds,
                    name,
                    colour,
                    f"rank {rank} step {step}: {name} {seconds:.4g} s ({what})",
                )
            )
            t += seconds
    return out


def rank_shapes(events: Events) -> list[Shape]:
    """Each rank's steps of the main phase (see the module), and the spans outside training: a step
    drawn as it ran when the journal keeps its collectives and the page has room, else by part."""
    steps = [e for e in events if e.get("phase") == "main" and e.get("event") == "step_end"]
    rank_steps = sum(len(_ranks_of(e)) for e in steps)
    op_count = sum(len(o.get("run", ())) for e in steps for o in (e.get("ops") or {}).values())
    as_ran = 2 * op_count + 2 * rank_steps <= MAX_PART_SHAPES
    whole = rank_steps * len(STEP_PARTS) > MAX_PART_SHAPES
    out: list[Shape] = []
    for e in steps:
        ends, ops = e.get("t_ranks") or [], e.get("ops") or {}
        for i, rank in enumerate(_ranks_of(e)):
            parts = [(k, float(e[k][i]) if isinstance(e.get(k), list) else 0.0) for k in STEP_PARTS]
            end = float(ends[i]) if i < len(ends) else float(e["t"])
            if as_ran and str(rank) in ops:
                out += _op_shapes(rank, int(e["step"]), ops[str(rank)], parts[0][1], end)
                continue
            start = max(float(e["t_start"]), end - sum(v for _, v in parts))
            out += _part_shapes(rank, int(e["step"]), parts, start, end, whole)
    for label, a, b in spans(events):
        out.append(
            Shape(-1, a, b, label, SPANS[label][1], f"{label}: {a:.4g} s to {b:.4g} s ({b - a:.4g} s)")
        )
    return out


def _heal_times(events: Events) -> dict[str, float]:
    """Fault id to when it healed: its ``fault_healed``, else the end of the recovery that followed it."""
    healed = {str(e["id"]): float(e["t"]) for e in events if e.get("event") == "fault_healed" and "t" in e}
    main = [e for e in events if e.get("phase") == "main"]
    pending: list[str] = []
    for e in main:
        if e.get("event") == "fault_injected" and str(e["id"]) not in healed:
            pending.append(str(e["id"]))
        elif e.get("event") == "recovery_complete" and pending:
            for fault in pending:
                healed[fault] = float(e.get("t_resume") or e["t"])
            pending = []
    return healed


def _first_number(*values: Any) -> float:
    """The first of ``values`` that is a number."""
    return next(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))


def fault_windows(events: Events) -> list[FaultWindow]:
    """Every fault that fired in the main phase, from its injection to its heal, in firing order."""
    healed = _heal_times(events)
    out: list[FaultWindow] = []
    t_now = 0.0
    for e in events:
        if e.get("phase") != "main":
            continue
        if e.get("event") == "step_end":
            t_now = float(e["t"])
        elif e.get("event") == "fault_injected":
            record: dict[str, Any] = e["record"] if isinstance(e.get("record"), dict) else {}
            params: dict[str, Any] = e["params"] if isinstance(e.get("params"), dict) else {}
            # a fault anchored to a point of the step (``during``) starts there on each rank: its step
            a = _first_number(record.get("t0"), params.get("at_time"), t_now)
            planned_end = record.get("t_end") or (
                a + float(record["length_s"]) if record.get("length_s") else a
            )
            b = healed.get(str(e["id"]), float(planned_end))
            rank = e.get("rank", -1)
            target = f" rank {rank}" if isinstance(rank, int) and rank >= 0 else ""
            label = f"{e['kind']}{target} (step {e.get('step')})"
            out.append(FaultWindow(str(e["id"]), str(e["kind"]), label, a, max(a, b)))
    return out


def marks(events: Events) -> list[tuple[float, str, str]]:
    """(virtual time, kind, label) of each detection and each recovery's end in the main phase."""
    out: list[tuple[float, str, str]] = []
    for e in events:
        if e.get("phase") != "main":
            continue
        if e.get("event") == "failure_detected" and "t" in e:
            out.append((float(e["t"]), "detected", f"step {e['step']}: detected by {e.get('detected_by')}"))
        elif e.get("event") == "recovery_complete":
            t = float(e.get("t_resume") or e["t"])
            out.append((t, "recovered", f"step {e['fail_step']}: {e.get('strategy')} done"))
    return out


def lane_ranks(events: Events) -> list[int]:
    """The ranks that have a lane: every rank of the world (``run_start``'s), else those seen training."""
    world = next((int(e["world"]) for e in events if e.get("event") == "run_start" and "world" in e), 0)
    seen = {r for e in events if e.get("event") == "step_end" for r in _ranks_of(e)}
    return list(range(world)) if world else sorted(seen)


def _rect(
    x: float, y: float, w: float, h: float, a: float, b: float, cls: str, style: str, title: str
) -> str:
    return (
        f'<rect class="{cls}" x="{x:.2f}" y="{y:.1f}" width="{max(w, 0.6):.2f}" height="{h:.1f}" '
        f'data-a="{a:.6g}" data-b="{b:.6g}" style="{style}"><title>{escape(title)}</title></rect>'
    )


def timeline_svg(events: Events) -> str:
    """The timeline (see the module) as one ``<svg>`` element; an empty string when nothing trained."""
    shapes = rank_shapes(events)
    faults = fault_windows(events)
    ranks = lane_ranks(events)
    if not ranks or not any(s.lane >= 0 for s in shapes):
        return ""
    t1 = max([s.b for s in shapes] + [f.b for f in faults] + [1e-9])
    t0 = min([s.a for s in shapes] + [f.a for f in faults] + [0.0])
    scale = (WIDTH - LEFT - RIGHT) / (t1 - t0)

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    lane_h = max(3.0, min(18.0, 640.0 / len(ranks)))
    top = AXIS + FAULT_ROW * len(faults) + 6
    height = top + lane_h * len(ranks) + 8
    row = {rank: top + i * lane_h for i, rank in enumerate(ranks)}
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" data-t0="{t0:.6g}" data-t1="{t1:.6g}" data-left="{LEFT}" '
        f'data-right="{WIDTH - RIGHT}" role="img" aria-label="timeline of the run on the virtual clock">',
        f'<defs><clipPath id="plot"><rect x="{LEFT}" y="0" width="{WIDTH - LEFT - RIGHT}" '
        f'height="{height:.0f}"/></clipPath></defs>',
        f'<g class="axis" data-ticks="{AXIS - 6}"></g>',
        '<g clip-path="url(#plot)">',
    ]
    for s in shapes:
        if s.lane < 0:
            parts.append(
                _rect(x(s.a), top, (s.b - s.a) * scale, height - top - 8, s.a, s.b, f"span {s.kind}",
                      f"fill:{s.colour};fill-opacity:0.28", s.title)
            )  # fmt: skip
    for s in shapes:
        if s.lane >= 0 and s.lane in row:
            parts.append(
                _rect(x(s.a), row[s.lane] + 1, (s.b - s.a) * scale, lane_h - 2, s.a, s.b, "part",
                      f"fill:{s.colour}", s.title)
            )  # fmt: skip
    for i, f in enumerate(faults):
        y = AXIS + i * FAULT_ROW
        parts.append(
            f'<g class="fault" data-fault="{escape(f.fault)}">'
            + _rect(x(f.a), top, (f.b - f.a) * scale, height - top - 8, f.a, f.b, "fault-window",
                    "fill:#c44e52;fill-opacity:0.12", f"{f.label}: {f.a:.4g} s to {f.b:.4g} s")
            + _rect(x(f.a), y + 1, (f.b - f.a) * scale, FAULT_ROW - 3, f.a, f.b, "fault-bar",
                    "fill:#c44e52;fill-opacity:0.55", f"{f.label}: injected at {f.a:.4g} s, healed at "
                    f"{f.b:.4g} s")
            + f'<text class="fault-label" x="{x(f.a) + 3:.2f}" y="{y + FAULT_ROW - 4}" data-a="{f.a:.6g}" '
            f'data-dx="3">{escape(f.label)}</text></g>'
        )  # fmt: skip
    for t, kind, label in marks(events):
        colour = "#c44e52" if kind == "detected" else "#2ca02c"
        parts.append(
            f'<line class="mark {kind}" x1="{x(t):.2f}" x2="{x(t):.2f}" y1="{top - 4}" y2="{height - 8:.0f}" '
            f'data-a="{t:.6g}" style="stroke:{colour};stroke-width:1.5;stroke-dasharray:4 2">'
            f"<title>{escape(label)} at {t:.4g} s</title></line>"
        )
    parts.append("</g>")
    every = max(1, math.ceil(11 / lane_h))  # a label where there is room for one: every lane, or every n-th
    for i, rank in enumerate(ranks):
        lane_y = row[rank]
        label = (
            f'<text x="{LEFT - 8}" y="{lane_y + min(lane_h, 12) - 2:.1f}" text-anchor="end">'
            f"rank {rank}</text>"
            if i % every == 0
            else ""
        )
        parts.append(
            f'<g class="lane" data-rank="{rank}"><rect x="0" y="{lane_y:.1f}" width="{LEFT - 4}" '
            f'height="{lane_h:.1f}" style="fill:none"/>{label}</g>'
        )
    parts.append(_static_ticks(t0, t1, x))
    parts.append("</svg>")
    return "".join(parts)


def _static_ticks(t0: float, t1: float, x: Any) -> str:
    """Time ticks as drawn without the script (the script redraws them when it zooms)."""
    out = ['<g class="static-ticks">']
    for i in range(7):
        t = t0 + (t1 - t0) * i / 6
        anchor = "start" if i == 0 else "end" if i == 6 else "middle"
        out.append(f'<text x="{x(t):.1f}" y="{AXIS - 8}" text-anchor="{anchor}">{t:.4g} s</text>')
    return "".join(out) + "</g>"


def legend(events: Events) -> list[tuple[str, str]]:
    """(label, colour) of every kind of shape the timeline of ``events`` draws."""
    drawn = {s.kind for s in rank_shapes(events)}
    items = [(name, colour) for name, colour in STEP_PARTS.values() if name in drawn]
    items += [COLLECTIVE] if COLLECTIVE[0] in drawn else []
    items += [("untraced", "#c7c7c7")] if "untraced" in drawn else []
    items += [(label, colour) for label, (_, colour) in SPANS.items() if label in drawn]
    items += [("step", "#4c72b0")] if "step" in drawn else []
    items += [("fault window", "#c44e52")] if fault_windows(events) else []
    kinds = {kind for _, kind, _ in marks(events)}
    items += [("failure detected", "#c44e52")] if "detected" in kinds else []
    return items + ([("training resumed", "#2ca02c")] if "recovered" in kinds else [])
