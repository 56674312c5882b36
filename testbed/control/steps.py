"""A completed step in the journal: every rank's clock, compute, waits, links and memory, one event.

``step_end`` keeps per rank what the checks, the hotspot diagnosis and the
timeline read (see docs/journal.md); a step that waits more than 15 % of its
time for its input warns, once per phase.

The links grow with ranks times peers: at 384 ranks they were 94 % of a
step's event (570 kB). Above :data:`LINK_DETAIL_MAX` ranks a step carries a
summary of its links (``ranks`` and ``links_summary``) and :class:`LinkTotals`
adds each link up over the phase, journalled once as ``link_totals``: what
the hotspot diagnosis and the fault effects read.
"""

from __future__ import annotations

import hashlib
from typing import Any

from testbed.actors.outcome import Outcome
from testbed.control.state import PhaseState
from testbed.core.journal import Journal
from testbed.core.link_records import add_observation

#: Above this share of a step spent waiting for input, the run is warned (a rule of thumb).
DATA_WAIT_WARN = 0.15
#: Worlds of up to this many ranks journal every link of every step; larger ones, a summary per
#: step and the totals per phase.
LINK_DETAIL_MAX = 64


class LinkTotals:
    """Each directed link's observations (bytes, seconds, rated seconds, receiver's wait, rated
    latency, and the seconds queued at the ingress if any) added up over the steps of one phase."""

    def __init__(self) -> None:
        self.totals: dict[tuple[int, int], list[float]] = {}

    def add(self, links: dict[str, dict[str, list[float]]]) -> dict[str, float]:
        """Add one step's links (receiver -> sender -> observations); that step's summary."""
        count, nbytes, wait = 0, 0.0, 0.0
        for dst, by_src in links.items():
            for src, obs in by_src.items():
                add_observation(self.totals, (int(src), int(dst)), obs)
                count, nbytes, wait = count + 1, nbytes + float(obs[0]), wait + float(obs[3])
        return {"links": count, "bytes": nbytes, "wait_s": wait}

    def journal(self, journal: Journal, phase: str) -> None:
        """One ``link_totals`` event (``"src->dst": [...]``), if any step was added."""
        if self.totals:
            links = {f"{s}->{d}": obs for (s, d), obs in sorted(self.totals.items())}
            journal.emit("link_totals", phase=phase, links=links)
            self.totals = {}


def combined_digest(digests: dict[int, str]) -> str:
    """One sha256 over every rank's parameter digest, in rank order."""
    h = hashlib.sha256()
    for rank in sorted(digests):
        h.update(digests[rank].encode())
    return h.hexdigest()


def warn_data_wait(journal: Journal, phase: PhaseState, step: int, vals: dict[int, Any]) -> None:
    """Warn once per phase when a step spends more than 15 % of its time waiting for input."""
    span = max(v["t"] for v in vals.values()) - min(v["t_start"] for v in vals.values())
    waited = max(v.get("data_wait_s", 0.0) for v in vals.values())
    if span <= 0 or waited / span <= DATA_WAIT_WARN or phase.warned_data:
        return
    phase.warned_data = True
    journal.emit(
        "warning",
        phase=phase.name,
        step=step,
        message=(
            f"step {step} waited {waited:.3g} s of {span:.3g} s ({waited / span:.0%}) for its input, "
            f"over the {DATA_WAIT_WARN:.0%} rule of thumb: the input pipeline, not the NPUs, sets the pace"
        ),
    )


def _ops(phase: str, vals: dict[int, Any], ranks: list[int]) -> dict[str, Any]:
    """The ranks' collectives of the step (``ops``), in the main phase only: a trace draws that phase,
    and the reference run's would double the journal's size for nothing."""
    if phase != "main":
        return {}
    return {"ops": {str(r): vals[r]["ops"] for r in ranks if "ops" in vals[r]}}


def journal_step_end(
    journal: Journal,
    phase: PhaseState,
    step: int,
    out: dict[int, Outcome],
    dp_share: float,
    totals: LinkTotals | None = None,
) -> None:
    """One ``step_end`` event for a step every training rank completed (``dp_share``: the share of
    data-parallel replicas that trained it); with ``totals`` its links go there, and the event
    carries their summary."""
    vals = {r: o.value for r, o in out.items()}
    warn_data_wait(journal, phase, step, vals)
    ranks = sorted(vals)
    losses = [vals[r]["loss"] for r in ranks if vals[r]["loss"] is not None]  # last pipeline stage
    journal.emit(
        "step_end",
        phase=phase.name,
        step=step,
        loss=sum(losses) / len(losses),
        lr=vals[ranks[0]]["lr"],
        t_start=min(v["t_start"] for v in vals.values()),
        dp_share=dp_share,
        t=max(v["t"] for v in vals.values()),
        t_ranks=[vals[r]["t"] for r in ranks],
        flops=[vals[r]["flops"] for r in ranks],
        data_wait_s=[vals[r].get("data_wait_s", 0.0) for r in ranks],
        compute_s=[vals[r]["compute_s"] for r in ranks],
        comm_wait_s=[vals[r]["comm_wait_s"] for r in ranks],
        bubble_s=[vals[r]["bubble_s"] for r in ranks],
        digest=combined_digest({r: vals[r]["digest"] for r in ranks}),
        algorithms=vals[ranks[0]]["algorithms"],
        **_ops(phase.name, vals, ranks),
        **_links(vals, ranks, totals),
        wait_by_op={str(r): vals[r]["wait_by_op"] for r in ranks},
        memory={k: [vals[r]["memory"][k] for r in ranks] for k in vals[ranks[0]]["memory"]},
        memory_events={str(r): vals[r]["memory_events"] for r in ranks if vals[r]["memory_events"]},
        **_corrupted(vals, ranks),
    )


def _corrupted(vals: dict[int, Any], ranks: list[int]) -> dict[str, Any]:
    """``sdc``: by rank, what a silent corruption changed in the step (the truth a detector is scored
    against); absent when nothing was corrupted."""
    sdc = {str(r): vals[r]["sdc"] for r in ranks if vals[r].get("sdc")}
    return {"sdc": sdc} if sdc else {}


def _links(vals: dict[int, Any], ranks: list[int], totals: LinkTotals | None) -> dict[str, Any]:
    links = {str(r): vals[r]["links"] for r in ranks}
    if totals is None:
        return {"links": links}
    return {"ranks": ranks, "links_summary": totals.add(links)}
