"""PNG figures of comparisons, sweeps and tuning (matplotlib, drawn off-screen); the run's timeline is
:mod:`testbed.report.timeline_plot`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The order and colour of the parts of a recovery in a stacked bar.
PARTS = {
    "detect_s": "#4c72b0",
    "restart_s": "#dd8452",
    "spare_s": "#937860",
    "relink_s": "#55a868",
    "load_s": "#c44e52",
    "recompute_s": "#8172b3",
    "rejoin_s": "#64b5cd",
    "hold_s": "#da8bc3",
    "interval_s": "#8c8c8c",
}


def pyplot() -> Any:
    """matplotlib's pyplot, drawing off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def strategy_figure(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Recovery time per strategy as stacked parts, beside each strategy's goodput."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["strategy"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, colour in PARTS.items():
        values = [float(r["breakdown"].get(part, 0.0)) for r in rows]
        if any(values):
            left.bar(names, values, bottom=bottom, color=colour, label=part[:-2])
            bottom = [b + v for b, v in zip(bottom, values)]
    left.set_ylabel("recovery time (virtual s)")
    left.legend(fontsize=8)
    goodput = [100.0 * float(r["goodput"] or 0.0) for r in rows]
    right.bar(names, goodput, color="#55a868")
    for i, g in enumerate(goodput):
        right.text(i, g, f"{g:.1f}%", ha="center", va="bottom", fontsize=9)
    right.set_ylabel("goodput (% of virtual time training)")
    right.set_ylim(0, 100)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sweep_figure(
    points: list[tuple[float, float]],
    optimum: float | None,
    path: Path,
    xlabel: str,
    title: str,
    fitted: float | None = None,
) -> Path:
    """Goodput against the swept value, with the analytical optimum (and the fitted curve's maximum)
    as vertical lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs, ys = [p[0] for p in points], [100.0 * p[1] for p in points]
    ax.plot(xs, ys, "o-", color="#4c72b0", label="measured goodput")
    best = max(range(len(points)), key=lambda i: ys[i])
    ax.plot([xs[best]], [ys[best]], "o", color="#c44e52", markersize=10, label=f"best measured: {xs[best]:g}")
    if optimum is not None:
        ax.axvline(optimum, color="#55a868", linestyle="--", label=f"Young/Daly optimum: {optimum:.3g}")
    if fitted is not None:
        ax.axvline(fitted, color="#8172b2", linestyle=":", label=f"fitted curve's maximum: {fitted:.3g}")
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput (%)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tune_figure(rows: list[dict[str, Any]], chosen: float | None, path: Path, name: str) -> Path:
    """False timeouts against the slowest detection of a real failure, one point per exec timeout."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    points: dict[tuple[float, int], list[dict[str, Any]]] = {}
    for r in rows:  # candidates at the same spot share one label
        latency = r["latency_s"] if r["latency_s"] is not None else 0.0
        points.setdefault((latency, r["false_exec"]), []).append(r)
    for i, ((latency, false), group) in enumerate(sorted(points.items())):
        values = [r["value"] for r in group]
        colour = "#55a868" if chosen in values else ("#c44e52" if false else "#4c72b0")
        ax.plot([latency], [false], "o", color=colour, markersize=9)
        label = "exec " + ", ".join(f"{v:g}" for v in values) + " s"
        if all(r["latency_s"] is None for r in group):
            label += " (nothing detected)"
        below = -14 if i % 2 else 6  # neighbours' labels on alternate sides
        ax.annotate(label, (latency, false), textcoords="offset points", xytext=(6, below), fontsize=8)
    ax.set_xlabel("slowest detection of a real failure (virtual s)")
    ax.set_ylabel("false timeouts")
    title = f"{name}: exec timeout candidates" + (f" (recommended {chosen:g} s, green)" if chosen else "")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
