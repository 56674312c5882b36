"""The run's timeline as a PNG: every step and every wait on the virtual clock, as what it was.

On top, on the virtual clock, each step's compute, comm
wait, data wait and bubble (its slowest rank), drawn only where the step
really trained; each recovery is cut into its parts in time (detection, a
restart or hot spare, re-link, load, a retry's hold and interval, the
recomputed steps), and a step's failed first attempt is drawn as such, so a
step that waited 1842 s for an exec timeout shows 1842 s of detection, not
of compute. Below, by step, the loss and the learning rate; when the run
recovered, the uninterrupted reference run's are drawn over them, each
resume is marked, and so is the first step whose parameters differ from the
reference's.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from testbed.recovery.record import procedure
from testbed.report.plots import pyplot

Events = list[dict[str, Any]]

#: The parts of a step in the timeline, bottom to top.
STEP_PARTS = {
    "compute_s": "#4c72b0",
    "comm_wait_s": "#dd8452",
    "data_wait_s": "#937860",
    "bubble_s": "#8172b3",
}

#: The spans of the timeline that are not training, in the order a recovery runs through them.
SPANS = {
    "detection": ("detect_s", "#c44e52"),
    "restart": ("restart_s", "#8c564b"),
    "hot spare": ("spare_s", "#937860"),
    "re-link": ("relink_s", "#e377c2"),
    "load": ("load_s", "#bcbd22"),
    "retry hold": ("hold_s", "#da8bc3"),
    "retry interval": ("interval_s", "#8c8c8c"),
    "recompute": ("recompute_s", "#dd8452"),
    "failed attempt": ("", "#7f7f7f"),
    "checkpoint": ("", "#55a868"),
}


def recovery_spans(e: dict[str, Any]) -> list[tuple[str, float, float]]:
    """A ``recovery_complete`` cut into its parts in time, from the failure on (a step retry's
    ``recompute_s`` is the step run again: training, not a span)."""
    b = e.get("breakdown") or {}
    t = float(e["t_death"]) if "t_death" in e else float(e["t"]) - float(e["total_s"])
    out: list[tuple[str, float, float]] = []
    for label, (key, _) in SPANS.items():
        seconds = float(b.get(key, 0.0)) if key else 0.0
        if seconds <= 0 or (key == "recompute_s" and procedure(str(e.get("strategy"))).reruns_step):
            continue
        out.append((label, t, t + seconds))
        t += seconds
    return out


def spans(events: Events) -> list[tuple[str, float, float]]:
    """Every span of the main phase that is not training: recoveries in their parts, the part of a
    failed step before it failed (unless the step went on from there, as after an op retry),
    checkpoint holds."""
    out: list[tuple[str, float, float]] = []
    main = [e for e in events if e.get("phase") == "main"]
    starts = {(int(e["step"]), float(e["t_start"])) for e in main if e.get("event") == "step_end"}
    for e in main:
        if e.get("event") == "recovery_complete":
            out += recovery_spans(e)
        elif e.get("event") == "failure_detected" and "t_start" in e:
            if (int(e["step"]), float(e["t_start"])) not in starts:
                out.append(("failed attempt", float(e["t_start"]), float(e["t_death"])))
        elif e.get("event") == "checkpoint_committed":
            start = float(e.get("t_saved", float(e["t"]) - float(e.get("write_s", 0.0))))
            if float(e["t_resume"]) > start:
                out.append(("checkpoint", start, float(e["t_resume"])))
    return [span for span in out if span[2] > span[1]]


def _cut(start: float, end: float, gaps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``[start, end]`` less every gap."""
    pieces = [(start, end)]
    for a, b in gaps:
        pieces = [p for s, e in pieces for p in ((s, min(e, a)), (max(s, b), e)) if p[1] > p[0]]
    return pieces


class _Gaps:
    """The gaps that reach into an interval, in their given order, without looking at every gap: a
    long run has a gap per checkpoint, and cutting each step by all of them was quadratic (a tenth
    of a 3,000-step run's driver time). A gap that reaches into no piece of a step cuts nothing."""

    def __init__(self, gaps: list[tuple[float, float]]) -> None:
        self.by_start = sorted(range(len(gaps)), key=lambda i: gaps[i][0])
        self.starts = [gaps[i][0] for i in self.by_start]
        self.reach: list[float] = []  # the furthest end among the gaps sorted up to here
        for i in self.by_start:
            self.reach.append(max(self.reach[-1], gaps[i][1]) if self.reach else gaps[i][1])
        self.gaps = gaps

    def into(self, start: float, end: float) -> list[tuple[float, float]]:
        """Every gap with ``a < end`` and ``b > start``, in the order given (``start < end``, as a
        step's are: an empty interval is cut to nothing by a gap that holds it, and left by none)."""
        found = []
        k = bisect.bisect_left(self.starts, end)  # gaps before k start before the interval ends
        while k > 0 and self.reach[k - 1] > start:
            k -= 1
            i = self.by_start[k]
            if self.gaps[i][1] > start:
                found.append(i)
        return [self.gaps[i] for i in sorted(found)]


def _step_boxes(steps: Events, gaps: list[tuple[float, float]]) -> dict[str, list[list[tuple[float, float]]]]:
    """Each step's stacked parts (its slowest rank's), drawn where it trained (outside ``gaps``)."""
    boxes: dict[str, list[list[tuple[float, float]]]] = {part: [] for part in STEP_PARTS}
    near = _Gaps(gaps)
    for e in steps:
        slowest = max(range(len(e["t_ranks"])), key=lambda i: e["t_ranks"][i]) if e.get("t_ranks") else 0
        start = float(e["t_start"])
        end = start + max(float(e["t"]) - start, 1e-12)
        for a, b in _cut(start, end, near.into(start, end)) or [(start, end)]:
            bottom = 0.0
            for part in STEP_PARTS:
                value = float(e[part][slowest]) if isinstance(e.get(part), list) and e[part] else 0.0
                if value > 0:
                    boxes[part].append([(a, bottom), (b, bottom), (b, bottom + value), (a, bottom + value)])
                bottom += value
    return boxes


def _faults(events: Events) -> list[tuple[float, str]]:
    """(virtual time, label) of each fault of the main phase as it fired."""
    out: list[tuple[float, str]] = []
    t_now = 0.0
    for e in events:
        if e.get("phase") != "main":
            continue
        if e["event"] == "step_end":
            t_now = float(e["t"])
        elif e["event"] == "fault_injected":
            rank = e.get("rank", -1)
            out.append(
                (t_now, f"{e['kind']} rank {rank}" if isinstance(rank, int) and rank >= 0 else e["kind"])
            )
    return out


def divergence_step(events: Events) -> int | None:
    """The first step whose parameters differ from the uninterrupted reference run's (None: none
    differs, or there is no reference)."""
    kept: dict[int, str] = {}
    reference: dict[int, str] = {}
    for e in events:
        if e.get("event") == "step_end" and "digest" in e:
            (kept if e.get("phase") == "main" else reference if e.get("phase") == "reference" else {})[
                int(e["step"])
            ] = e["digest"]
    return next((s for s in sorted(kept) if s in reference and kept[s] != reference[s]), None)


def _curves(events: Events, kept: Events, loss_ax: Any, lr_ax: Any) -> int | None:
    """Loss and LR by step: the main run's kept steps, the reference's over them, where training
    resumed, and the first step that diverged (returned)."""
    reference = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "reference"]
    for ax, key, colour in ((loss_ax, "loss", "#4c72b0"), (lr_ax, "lr", "#55a868")):
        mine = sorted((int(e["step"]), float(e[key])) for e in kept if e.get(key) is not None)
        if mine:
            ax.plot(*zip(*mine), ".-", color=colour, label=f"{key} (this run)", markersize=3)
        theirs = sorted((int(e["step"]), float(e[key])) for e in reference if e.get(key) is not None)
        if theirs:
            ax.plot(*zip(*theirs), "--", color="black", linewidth=1, label=f"{key} (uninterrupted)")
    for e in events:
        if e.get("event") == "resume" and e.get("phase") == "main":
            for ax in (loss_ax, lr_ax):
                ax.axvline(int(e["from_step"]) + 0.5, color="#7f7f7f", linestyle=":", linewidth=1)
    step = divergence_step(events)
    if step is None:
        return None
    for ax in (loss_ax, lr_ax):
        ax.axvline(step, color="#d62728", linewidth=1.5)
    loss_ax.annotate(
        f" diverged at step {step}",
        (step, 1.0),
        xycoords=("data", "axes fraction"),
        fontsize=8,
        va="top",
        ha="left",
        color="#d62728",
    )
    return step


def timeline_figure(events: Events, path: Path, title: str) -> Path:
    """Draw the timeline of ``events`` (see the module) into ``path``."""
    plt = pyplot()
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    main = [e for e in events if e.get("phase") == "main"]
    runs = [e for e in main if e["event"] == "step_end"]
    kept = list({int(e["step"]): e for e in runs}.values())
    shaded = spans(events)
    gaps = [(a, b) for label, a, b in shaded if label != "recompute"]
    fig = plt.figure(figsize=(10, 7.5))
    grid = fig.add_gridspec(3, 1, height_ratios=(3, 1.6, 1.4))
    top = fig.add_subplot(grid[0])
    loss_ax = fig.add_subplot(grid[1])
    lr_ax = fig.add_subplot(grid[2], sharex=loss_ax)
    thin = len(runs) <= 200  # a white edge between steps while there is room for one
    for part, boxes in _step_boxes(runs, gaps).items():  # one artist a part: a long run draws in a blink
        if boxes:
            edges = {"edgecolors": "white", "linewidths": 0.6} if thin else {"linewidths": 0}
            top.add_collection(PolyCollection(boxes, facecolors=STEP_PARTS[part], **edges), autolim=True)
    top.autoscale_view()
    top.set_ylim(bottom=0)
    for label, a, b in shaded:
        top.axvspan(a, b, color=SPANS[label][1], alpha=0.25, linewidth=0)
    handles = [Patch(color=c, label=p[:-2].replace("_", " ")) for p, c in STEP_PARTS.items()]
    seen = {label for label, _, _ in shaded}
    handles += [Patch(color=c, alpha=0.4, label=label) for label, (_, c) in SPANS.items() if label in seen]
    marked = _curves(events, kept, loss_ax, lr_ax)
    faults = _faults(events)
    for t, _ in faults:
        top.axvline(t, color="#c44e52", linestyle="--", linewidth=1)
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
    top.set_ylabel("seconds per step\n(slowest rank)")
    top.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    loss_ax.set_ylabel("loss")
    lr_ax.set_ylabel("learning rate")
    for ax in (loss_ax, lr_ax):
        if ax.lines:
            ax.legend(fontsize=7, loc="upper right")
    top.set_xlabel("virtual time (s); dashed red: a fault fired")
    note = "; red: the first step whose parameters differ from the uninterrupted run's" if marked else ""
    lr_ax.set_xlabel(f"step; dotted: training resumed after this step{note}")
    fig.suptitle(title)
    # fixed margins that fit these labels: tight_layout measured every text first, 40 % of the drawing
    fig.subplots_adjust(left=0.09, right=0.985, top=0.94, bottom=0.07, hspace=0.42)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
