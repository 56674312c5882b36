"""Find the hotspot from the journal alone: the straggler rank, the degraded link, the rank given
most of the work, the shared ingress or the placement that made one, with the evidence.

The method Ascend's operations guides give: compare what each rank waits for. Two measurements
in every ``step_end`` make it exact enough to name a culprit:

- per rank, compute seconds and FLOPs: a healthy rank computes at the
  preset's rate, so seconds per FLOP is the same on every healthy rank; a
  straggler's is higher (thermal throttling, a degraded chip);
- per rank and sender, ``links``: bytes received, seconds on the link (from
  the sender's start of transmission to arrival), the seconds the link's
  rated latency and bandwidth give for them, the seconds this rank waited,
  and the rated latency part: a degraded link carries its bytes slower than
  rated (judged on the whole time, and on the time beyond the latency, where
  a bandwidth cut shows even on small messages). A world larger than
  ``LINK_DETAIL_MAX`` ranks journals them once per phase, added up
  (``link_totals``), and each step names its ``ranks``.

A culprit is named only when exactly one rank (or one link) stands out by
more than ``THRESHOLD`` and nothing else does; several suspects, or a
deviation too small to be sure of, give ``unknown``; no deviation at all
gives ``none`` unless the layout of the traffic or the work made a hotspot
by itself: one rank given far more FLOPs than its peers (``imbalance``: a
hot expert), a receiver's ingress shared by several senders at once
(``contention``) or a TP group split across supernodes (``placement``, see
:mod:`testbed.report.link_load`). The evidence says how much slower the culprit was and how
long its peers waited on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from testbed.core.link_records import link_totals
from testbed.report.link_load import contention, imbalance, listed, placement, rank_work

Events = Sequence[dict[str, Any]]

#: A rank or link this much slower than its peers (or its rating) is a suspect.
THRESHOLD = 1.2
#: Below this relative deviation everything runs as modelled: a healthy link's time equals its
#: rating exactly (both are computed alike); compute rates differ only by float rounding.
NOISE = 1e-9


@dataclass(frozen=True)
class Diagnosis:
    """What the journal says: ``straggler``, ``link``, ``imbalance``, ``contention``, ``placement``,
    ``none`` or ``unknown``, and why."""

    verdict: str
    culprit: Any = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"verdict": self.verdict, "culprit": self.culprit, "message": self.message, **self.evidence}


def _kept_steps(events: Events, phase: str) -> list[dict[str, Any]]:
    kept: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "step_end" and e.get("phase") == phase and ("links" in e or "ranks" in e):
            kept[int(e["step"])] = e
    return [kept[s] for s in sorted(kept)]


def compute_rates(work: dict[int, list[float]]) -> dict[int, float]:
    """Per rank, compute seconds per FLOP over the steps (``work``: :func:`rank_work`; ranks that
    computed nothing left out)."""
    return {r: w[3] / w[2] for r, w in work.items() if w[2] > 0}


def slowdown(total: list[float]) -> float:
    """How much slower than rated a link carried its messages: of the whole time, or of the time
    the bytes took beyond the latency (a bandwidth cut hardly shows on latency-bound messages)."""
    whole = total[1] / total[2] if total[2] > 0 else 1.0
    occupancy = total[2] - total[4]
    if occupancy <= total[2] * 1e-6:  # no bytes to speak of: only the whole time says anything
        return whole
    return max(whole, (total[1] - total[4]) / occupancy)


def waited_on(totals: dict[tuple[int, int], list[float]], rank: int) -> float:
    """Seconds the other ranks spent waiting for messages from ``rank``."""
    return sum(obs[3] for (src, dst), obs in totals.items() if src == rank and dst != rank)


def diagnose(events: Events, phase: str = "main") -> Diagnosis:
    """The hotspot of ``phase`` from its journalled steps."""
    steps = _kept_steps(events, phase)
    if not steps:
        return Diagnosis(
            "unknown", message=f"no step of phase '{phase}' with link measurements in the journal"
        )
    work = rank_work(steps)
    rates = compute_rates(work)
    typical = median(rates.values()) if rates else 0.0
    slow_ranks = {r: v / typical for r, v in rates.items() if typical > 0 and v / typical > THRESHOLD}
    odd_ranks = {r: v / typical for r, v in rates.items() if typical > 0 and abs(v / typical - 1) > NOISE}
    totals = link_totals(steps, events, phase)
    links = {k: slowdown(v) for k, v in totals.items()}
    slow_links = {k: s for k, s in links.items() if s > THRESHOLD}
    odd_links = {k: s for k, s in links.items() if abs(s - 1) > NOISE}
    evidence: dict[str, Any] = {
        "steps": len(steps),
        "slow_ranks": {str(r): round(x, 3) for r, x in sorted(slow_ranks.items())},
        "slow_links": {f"{a}->{b}": round(x, 3) for (a, b), x in sorted(slow_links.items())},
    }
    if len(slow_ranks) == 1 and not slow_links and set(odd_ranks) == set(slow_ranks):
        (rank, factor), waits = next(iter(slow_ranks.items())), 0.0
        waits = waited_on(totals, rank)
        evidence.update(factor=round(factor, 3), peers_waited_s=waits)
        return Diagnosis(
            "straggler",
            rank,
            f"rank {rank} is a straggler: it computes {factor:.2f}x slower per FLOP than the median rank, "
            f"and its peers waited {waits:.4g} s for its messages over {len(steps)} step(s)",
            evidence,
        )
    pairs = {(min(k), max(k)) for k in slow_links}
    if len(pairs) == 1 and not slow_ranks and set(odd_links) == set(slow_links):
        (a, b) = pairs.pop()
        ways = {f"{x}->{y}": round(f, 3) for (x, y), f in sorted(slow_links.items())}
        carried = sum(totals[k][0] for k in slow_links)
        waited = {str(y): totals[(x, y)][3] for (x, y) in sorted(slow_links)}
        evidence.update(directions=ways, receivers_waited_s=waited, bytes=carried)
        shown = ", ".join(f"{k} {v:.2f}x slower" for k, v in ways.items())
        return Diagnosis(
            "link",
            [a, b],
            f"link {a}<->{b} is degraded ({shown} than its rated speed, {carried:.4g} bytes); "
            + ", ".join(f"rank {y} waited {w:.4g} s on it" for y, w in waited.items())
            + f" over {len(steps)} step(s)",
            evidence,
        )
    if not odd_ranks and not odd_links:
        for cause in (
            imbalance(work, len(steps)),
            contention(totals, len(steps), THRESHOLD),
            placement(events, totals, len(steps), THRESHOLD),
        ):
            if cause is not None:
                return Diagnosis(cause.verdict, cause.culprit, cause.message, {**evidence, **cause.evidence})
        return Diagnosis(
            "none",
            message="no hotspot: every rank computes at the same rate and every link at its rated speed",
            evidence=evidence,
        )
    suspects = [f"rank {r}" for r in sorted(odd_ranks)] + [f"link {a}->{b}" for a, b in sorted(odd_links)]
    shown = listed(suspects, ", ", 6)
    return Diagnosis(
        "unknown",
        message=f"no single culprit: {len(suspects)} suspect(s) deviate from the model ({shown}); "
        f"a culprit must be the only one more than {THRESHOLD}x slower",
        evidence=evidence,
    )
