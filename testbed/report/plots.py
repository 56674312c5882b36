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


def tune_figure(
    connect_rows: list[dict[str, Any]],
    exec_rows: list[dict[str, Any]],
    advice: dict[str, Any],
    path: Path,
    name: str,
) -> Path:
    """What the tuner compared: each connect candidate's false setup timeouts beside the slowest link
    setup; each exec candidate's false timeouts and how late it caught a real failure, with the values
    the ladder rules out shaded and the chosen ones marked."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=(2, 3))
    ran = [r for r in connect_rows if r["verdict"] != "not run"]
    xs = [r["value"] for r in connect_rows]
    colours = [
        "#c44e52" if r.get("false_setup") else "#bbbbbb" if r["verdict"] == "not run" else "#4c72b0"
        for r in connect_rows
    ]
    left.bar([f"{x:g}" for x in xs], [r.get("false_setup", 0) or 0.02 for r in connect_rows], color=colours)
    setups = [r["setup_max_s"] for r in ran if r.get("setup_max_s") is not None]
    for i, r in enumerate(connect_rows):
        label = (
            "not run"
            if r["verdict"] == "not run"
            else ("chosen" if r["value"] == advice.get("connect_s") else "")
        )
        if label:
            left.annotate(label, (i, 0.05), ha="center", fontsize=8)
    left.set_title(f"connect: slowest setup {max(setups):.4g} s" if setups else "connect", fontsize=9)
    left.set_xlabel("connect timeout (s); limit = value + 20 s")
    left.set_ylabel("false link-setup timeouts")
    floor = (advice.get("connect_s") or max(xs)) + 20.0
    values = [r["value"] for r in exec_rows]
    right.bar(
        range(len(values)),
        [r["false_exec"] + r["false_setup"] for r in exec_rows],
        color="#c44e52",
        label="false timeouts",
    )
    below = [i for i, v in enumerate(values) if v <= floor]
    if below:
        right.axvspan(
            min(below) - 0.5,
            max(below) + 0.5,
            color="#bbbbbb",
            alpha=0.35,
            label=f"below the ladder (<= {floor:g} s)",
        )
    twin = right.twinx()
    caught = [(i, r["latency_s"]) for i, r in enumerate(exec_rows) if r["latency_s"] is not None]
    if caught:
        twin.plot(*zip(*caught), "o-", color="#4c72b0", label="slowest detection of a real failure")
    twin.set_ylabel("slowest detection (virtual s)")
    chosen = advice.get("exec_s")
    if chosen in values:
        right.axvline(values.index(chosen), color="#55a868", linewidth=2, label=f"chosen {chosen:g} s")
    right.set_xticks(range(len(values)), [f"{v:g}" for v in values])
    right.set_xlabel("exec timeout (s)")
    right.set_ylabel("false timeouts")
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(handles=handles, fontsize=7, loc="upper right")
    fig.suptitle(f"{name}: timeout candidates")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
