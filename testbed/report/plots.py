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
    points: list[tuple[float, float]],
    optimum: float | None,
    path: Path,
    xlabel: str,
    title: str,
    fitted: float | None = None,
) -> Path:
    """Goodput against the swept value, with the analytical optimum (and the fitted curve's maximum)
    as vertical lines."""
    plt = _pyplot()
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
    plt = _pyplot()
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


#: The parts of a step in the timeline, bottom to top.
STEP_PARTS = {
    "compute_s": "#4c72b0",
    "comm_wait_s": "#dd8452",
    "data_wait_s": "#937860",
    "bubble_s": "#8172b3",
}


def _main_timeline(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """The main phase's step runs, and (virtual time, label) of each fault as it fired."""
    steps: list[dict[str, Any]] = []
    faults: list[tuple[float, str]] = []
    t_now = 0.0
    for e in events:
        if e.get("phase") != "main":
            continue
        if e["event"] == "step_end":
            steps.append(e)
            t_now = float(e["t"])
        elif e["event"] == "fault_injected":
            rank = e.get("rank", -1)
            faults.append(
                (t_now, f"{e['kind']} rank {rank}" if isinstance(rank, int) and rank >= 0 else e["kind"])
            )
    return steps, faults


#: Colours of the spans between steps: a checkpoint write, a recovery until training resumes, the
#: steps it ran again.
SPANS = {"checkpoint write": "#55a868", "recovery": "#c44e52", "recompute": "#dd8452"}


def _shade_spans(events: list[dict[str, Any]], axes: tuple[Any, ...]) -> list[Any]:
    """Shade each checkpoint write and each recovery (until training resumes, then the recomputed
    steps) on ``axes``; returns the legend's handles of the kinds that occur."""
    from matplotlib.patches import Patch

    spans: list[tuple[str, float, float]] = []
    for e in events:
        if e.get("phase") != "main":
            continue
        if e.get("event") == "checkpoint_committed" and float(e.get("write_s", 0.0)) > 0:
            spans.append(("checkpoint write", float(e["t"]) - float(e["write_s"]), float(e["t"])))
        elif e.get("event") == "recovery_complete":
            end, redo = float(e["t"]), float(e.get("breakdown", {}).get("recompute_s", 0.0))
            spans.append(("recovery", end - float(e["total_s"]), end - redo))
            if redo > 0:
                spans.append(("recompute", end - redo, end))
    for ax in axes:
        for kind, start, end in spans:
            ax.axvspan(start, end, color=SPANS[kind], alpha=0.18, linewidth=0)
    seen = {kind for kind, _, _ in spans}
    return [Patch(color=c, alpha=0.35, label=k) for k, c in SPANS.items() if k in seen]


def timeline_figure(events: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Virtual time across: each step's compute, comm wait, data wait and bubble (its slowest rank),
    the loss, faults as they fired, recoveries shaded from the failure to the end of recompute."""
    plt = _pyplot()
    from matplotlib.collections import PolyCollection

    steps, faults = _main_timeline(events)
    fig, (top, low) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, height_ratios=(3, 2))
    boxes: dict[str, list[list[tuple[float, float]]]] = {part: [] for part in STEP_PARTS}
    for e in steps:
        slowest = max(range(len(e["t_ranks"])), key=lambda i: e["t_ranks"][i]) if e.get("t_ranks") else 0
        start, bottom = float(e["t_start"]), 0.0
        end = start + max(float(e["t"]) - start, 1e-12)
        for part in STEP_PARTS:
            value = float(e[part][slowest]) if isinstance(e.get(part), list) and e[part] else 0.0
            if value > 0:
                boxes[part].append(
                    [(start, bottom), (end, bottom), (end, bottom + value), (start, bottom + value)]
                )
            bottom += value
    thin = len(steps) <= 200  # a white edge between steps while there is room for one
    for part, colour in STEP_PARTS.items():  # one artist a part: a long run draws in a blink
        if boxes[part]:
            edges = {"edgecolors": "white", "linewidths": 0.6} if thin else {"linewidths": 0}
            top.add_collection(PolyCollection(boxes[part], facecolors=colour, **edges), autolim=True)
    top.autoscale_view()
    top.set_ylim(bottom=0)
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=p[:-2].replace("_", " ")) for p, c in STEP_PARTS.items()]
    handles += _shade_spans(events, (top, low))
    losses = [(float(e["t"]), float(e["loss"])) for e in steps if e.get("loss") is not None]
    if losses:
        low.plot([t for t, _ in losses], [v for _, v in losses], ".-", color="#4c72b0", label="loss")
    for ax in (top, low):
        for t, _ in faults:
            ax.axvline(t, color="#c44e52", linestyle="--", linewidth=1)
    for t, label in faults:
        top.annotate(
            label,
            (t, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            va="top",
            ha="right",
            color="#c44e52",
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0, "pad": 1},
        )
    top.set_ylabel("seconds per step (slowest rank)")
    top.legend(handles=handles, fontsize=8, loc="upper left")
    low.set_ylabel("loss")
    low.set_xlabel("virtual time (s); dashed: a fault fired")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
