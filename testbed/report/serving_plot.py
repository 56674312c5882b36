"""``serving.png``: a serving run over virtual time, from its journal.

Three panels on one time axis: the tokens streamed per second (in one-second
bins), every request's time to first token at its arrival (failed ones
marked), and each instance's KV cache occupancy. Instances lost are vertical
lines; beside training, its checkpoint writes are shaded and its allreduces
drawn as thin bands.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from testbed.report.check_result import of
from testbed.report.plots import pyplot
from testbed.serve.colocation import training_windows


def _throughput(its: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    if not its:
        return [], []
    end = max(e["start_s"] + e["duration_s"] for e in its)
    bins = [0.0] * (math.floor(end) + 1)
    for e in its:
        bins[math.floor(e["start_s"] + e["duration_s"])] += e["tokens"]
    return [i + 0.5 for i in range(len(bins))], bins


def _mark_training(events: list[dict[str, Any]], axes: tuple[Any, ...]) -> None:
    colour = {"checkpoint": ("tab:orange", 0.15), "allreduce": ("tab:purple", 0.2)}
    for w in training_windows(events):
        for ax in axes:
            ax.axvspan(w.start_s, w.end_s, color=colour[w.kind][0], alpha=colour[w.kind][1], lw=0)


def serving_figure(events: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Write the figure of a serving run to ``path``; None (nothing written) if it served nothing."""
    if not of(events, "serve_start"):
        return None
    plt = pyplot()
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    its = of(events, "serve_iteration")
    x, y = _throughput(its)
    top.step(x, y, where="mid", color="tab:blue")
    top.set_ylabel("tokens / s")
    ends = of(events, "request_end")
    done = [e for e in ends if e["status"] == "done" and e.get("ttft_s") is not None]
    mid.scatter([e["arrival_s"] for e in done], [e["ttft_s"] for e in done], s=6, color="tab:green")
    failed = [e for e in ends if e["status"] != "done"]
    mid.scatter(
        [e["arrival_s"] for e in failed], [0] * len(failed), marker="x", color="tab:red", label="lost"
    )
    mid.set_ylabel("TTFT (s)")
    if failed:
        mid.legend(loc="upper left", fontsize=8)
    for name in sorted({e["instance"] for e in its}):
        mine = [e for e in its if e["instance"] == name]
        low.plot(
            [e["start_s"] + e["duration_s"] for e in mine],
            [e["kv"]["occupancy"] for e in mine],
            lw=0.8,
            label=name,
        )
    low.set_ylabel("KV occupancy")
    low.set_ylim(0, 1.05)
    low.set_xlabel("virtual time (s)")
    low.legend(loc="upper left", fontsize=8)
    for lost in of(events, "instance_lost"):
        for ax in (top, mid, low):
            ax.axvline(lost["at_s"], color="tab:red", ls="--", lw=1)
    _mark_training(events, (top, mid, low))
    if x:
        low.set_xlim(0, x[-1] * 1.02)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
