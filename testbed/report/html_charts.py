"""Small inline SVG charts for the run's page: goodput as one stacked bar, a recovery cut into its parts,
memory by step. Each is complete without scripts; each part's ``<title>`` names it and its figure."""

from __future__ import annotations

from html import escape
from typing import Any

from testbed.report.fault_rows import BREAKDOWN_ORDER

#: Where a run's virtual time went, as ``report.json``'s goodput names it, with colours.
GOODPUT_PARTS = {
    "useful_s": ("trained", "#55a868"),
    "lost_s": ("lost work", "#c44e52"),
    "recovery_s": ("recovery", "#8c564b"),
    "checkpoint_s": ("checkpoint holds", "#4c72b0"),
    "integrity_s": ("integrity checks", "#8172b3"),
    "degraded_s": ("degraded", "#dd8452"),
    "other_s": ("other", "#8c8c8c"),
}
#: The colours of a recovery's parts (``breakdown`` keys).
BREAKDOWN_COLOURS = {
    "detect_s": "#c44e52",
    "restart_s": "#8c564b",
    "spare_s": "#937860",
    "relink_s": "#e377c2",
    "load_s": "#bcbd22",
    "hold_s": "#da8bc3",
    "interval_s": "#8c8c8c",
    "recompute_s": "#dd8452",
}


def stacked_bar(
    parts: list[tuple[str, float, str]], width: int = 640, height: int = 26, cls: str = ""
) -> str:
    """One horizontal bar of ``(label, value, colour)`` parts, each as wide as its share."""
    total = sum(v for _, v, _ in parts if v > 0)
    if total <= 0:
        return ""
    out = [f'<svg class="bar {cls}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    x = 0.0
    for label, value, colour in parts:
        if value <= 0:
            continue
        w = value / total * width
        out.append(
            f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" style="fill:{colour}" '
            f'data-part="{escape(label)}"><title>{escape(label)}: {value:.4g} s '
            f"({value / total:.1%})</title></rect>"
        )
        x += w
    return "".join(out) + "</svg>"


def goodput_bar(goodput: dict[str, Any]) -> str:
    """The run's virtual time as one bar: trained, lost work, recovery, checkpoint holds, ..."""
    parts = [(name, float(goodput.get(key) or 0.0), colour) for key, (name, colour) in GOODPUT_PARTS.items()]
    return stacked_bar(parts, cls="goodput")


def recovery_bar(recovery: dict[str, Any], width: int = 360) -> str:
    """A recovery cut into its parts (detection, restart, re-link, load, recompute, ...)."""
    b = recovery.get("breakdown") or {}
    parts = [(k[:-2], float(b[k]), BREAKDOWN_COLOURS.get(k, "#8c8c8c")) for k in BREAKDOWN_ORDER if k in b]
    return stacked_bar(parts, width=width, height=16, cls="recovery")


def memory_chart(trend: list[dict[str, Any]], width: int = 640, height: int = 180) -> str:
    """Fragmentation (0..1, left) and reserved MiB (right, scaled to its peak) by step: lines with points."""
    if not trend:
        return ""
    left, right, top, bottom = 44, 56, 10, 26
    steps = [int(m["step"]) for m in trend]
    s0, s1 = min(steps), max(max(steps), min(steps) + 1)
    peak = max(float(m.get("reserved") or 0) for m in trend) or 1.0

    def x(step: int) -> float:
        return left + (step - s0) / (s1 - s0) * (width - left - right)

    def y(share: float) -> float:
        return top + (1 - share) * (height - top - bottom)

    out = [f'<svg class="memory" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    out.append(
        f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" style="stroke:#999"/>'
        f'<text x="{left - 4}" y="{y(1) + 4:.1f}" text-anchor="end">1</text>'
        f'<text x="{left - 4}" y="{y(0):.1f}" text-anchor="end">0</text>'
        f'<text x="{width - right + 4}" y="{y(1) + 4:.1f}">{peak / 2**20:.4g} MiB</text>'
        f'<text x="{left}" y="{height - 6}">step {s0}</text>'
        f'<text x="{width - right}" y="{height - 6}" text-anchor="end">step {s1}</text>'
    )

    def share(m: dict[str, Any], key: str) -> float:
        value = float(m.get(key) or 0.0)
        return value if key == "fragmentation" else value / peak

    for key, colour in (("fragmentation", "#c44e52"), ("reserved", "#4c72b0")):
        points = " ".join(f"{x(int(m['step'])):.1f},{y(share(m, key)):.1f}" for m in trend)
        out.append(f'<polyline class="{key}" points="{points}" style="fill:none;stroke:{colour}"/>')
        for m in trend[:: max(1, len(trend) // 60)]:
            value = m.get(key) or 0
            shown = f"{value:.3f}" if key == "fragmentation" else f"{float(value) / 2**20:.4g} MiB"
            out.append(
                f'<circle cx="{x(int(m["step"])):.1f}" cy="{y(share(m, key)):.1f}" r="2.5" '
                f'style="fill:{colour}">'
                f"<title>step {m['step']}: {key} {shown}</title></circle>"
            )
    return "".join(out) + "</svg>"
