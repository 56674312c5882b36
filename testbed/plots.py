"""PNG figures of comparisons and sweeps (matplotlib, drawn off-screen)."""

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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def strategy_figure(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Recovery time per strategy as stacked parts, beside each strategy's goodput."""
    plt = _pyplot()
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
    points: list[tuple[float, float]], optimum: float | None, path: Path, xlabel: str, title: str
) -> Path:
    """Goodput against the swept value, with the analytical optimum as a vertical line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs, ys = [p[0] for p in points], [100.0 * p[1] for p in points]
    ax.plot(xs, ys, "o-", color="#4c72b0", label="measured goodput")
    best = max(range(len(points)), key=lambda i: ys[i])
    ax.plot([xs[best]], [ys[best]], "o", color="#c44e52", markersize=10, label=f"best measured: {xs[best]:g}")
    if optimum is not None:
        ax.axvline(optimum, color="#55a868", linestyle="--", label=f"Young/Daly optimum: {optimum:.3g}")
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
