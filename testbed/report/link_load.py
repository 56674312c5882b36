"""Hotspots that arise from how the traffic and the work are laid out, not from a fault: a shared
ingress, a placement, a skewed load.

Three causes, each read from the journal alone:

- **contention**: a receiver's ingress carries one message at a time
  (:meth:`~testbed.fabric.clock.RankClock.land`), so when several senders'
  bytes reach one rank at once (an incast: a reduce to one root, a skewed
  all-to-all into a hot expert) they queue. Each link's record then carries
  the seconds its messages queued, apart from the link's own time: the link
  is healthy, the receiver is the hotspot.
- **placement**: a TP group that a topology-unaware placement split across
  supernodes (the journal's ``placement`` event names it) sends its
  per-layer allreduces over the inter-supernode links, which carry each of
  its bytes several times as long as the group's links inside a supernode,
  while those wait. Every link runs at its rated speed: nothing is broken
  but the layout.
- **imbalance**: a rank given far more of the work than its peers (a hot
  expert that a skewed router sends most tokens to, a pipeline stage with
  most of the layers) computes for longer at the same rate per FLOP, and
  its peers wait for it in their collectives. Nothing is slow; the work is
  skewed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from testbed.core.link_records import queued_s, step_ranks

Totals = dict[tuple[int, int], list[float]]


@dataclass(frozen=True)
class Cause:
    """A hotspot's cause: its kind, what to name, the message and the evidence."""

    verdict: str
    culprit: Any
    message: str
    evidence: dict[str, Any]


def listed(parts: list[str], sep: str = "; ", most: int = 4) -> str:
    """The first ``most`` of ``parts`` joined, and how many more there are."""
    return sep.join(parts[:most]) + (f" (+{len(parts) - most} more)" if len(parts) > most else "")


def contention(totals: Totals, steps: int, threshold: float) -> Cause | None:
    """The ranks whose ingress made their senders' messages queue by more than ``threshold - 1`` of
    the time the links themselves took, or None if no rank's did."""
    queued: dict[int, float] = {}
    on_links: dict[int, float] = {}
    senders: dict[int, list[int]] = {}
    behind: dict[int, list[int]] = {}
    for (src, dst), obs in totals.items():
        on_links[dst] = on_links.get(dst, 0.0) + obs[1]
        senders.setdefault(dst, []).append(src)
        if queued_s(obs) > 0.0:
            queued[dst] = queued.get(dst, 0.0) + queued_s(obs)
            behind.setdefault(dst, []).append(src)
    hot = sorted(r for r, q in queued.items() if on_links[r] > 0 and q / on_links[r] > threshold - 1)
    if not hot:
        return None
    shown = listed(
        [
            f"rank {r}'s messages from {', '.join(map(str, sorted(behind[r])))} queued {queued[r]:.4g} s "
            f"behind other senders' bytes ({queued[r] / on_links[r]:.2f}x its links' own time; "
            f"its senders: {', '.join(map(str, sorted(senders[r])))})"
            for r in hot
        ]
    )
    return Cause(
        "contention",
        hot,
        f"{'ingress' if len(hot) == 1 else 'ingresses'} shared by several senders at once (an incast), "
        f"over {steps} step(s): {shown}; the links are healthy: spread the traffic (another algorithm, "
        "a balanced routing) or give the receiver more bandwidth",
        {
            "queued_s": {str(r): queued[r] for r in hot},
            "queued_from": {str(r): sorted(behind[r]) for r in hot},
            "senders": {str(r): sorted(senders[r]) for r in hot},
        },
    )


def _placement_event(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in events if e.get("event") == "placement"), None)


def placement(events: Sequence[dict[str, Any]], totals: Totals, steps: int, threshold: float) -> Cause | None:
    """The split TP groups whose links across supernodes carry each byte more than ``threshold``
    times as long as their links inside one (or that have no link inside one), or None (no split
    group, or links across as fast as inside: a preset whose two classes are alike). Every link runs
    at its rating here, so this names what the layout costs, measured on the traffic."""
    found = _placement_event(events)
    if found is None:
        return None
    node = {int(r): int(s) for r, s in found["supernode_of"].items()}
    hot: list[dict[str, Any]] = []
    for group in found["split_tp_groups"]:
        members = set(group)
        across = {k: v for k, v in totals.items() if set(k) <= members and node[k[0]] != node[k[1]]}
        inside = {k: v for k, v in totals.items() if set(k) <= members and node[k[0]] == node[k[1]]}
        if not across:
            continue
        per_byte = {
            name: _seconds_per_byte(links) for name, links in (("across", across), ("inside", inside))
        }
        # a group with no link inside one supernode (one member in each) is across entirely
        ratio = per_byte["across"] / per_byte["inside"] if per_byte["inside"] > 0 else None
        if ratio is None or ratio > threshold:
            hot.append(
                {
                    "group": list(group),
                    "links": [f"{a}->{b}" for a, b in sorted(across)],
                    "per_byte_ratio": None if ratio is None else round(ratio, 3),
                    "seconds_across": sum(v[1] for v in across.values()),
                    "bytes_across": sum(v[0] for v in across.values()),
                    "waited_across_s": sum(v[3] for v in across.values()),
                    "waited_inside_s": sum(v[3] for v in inside.values()),
                }
            )
    if not hot:
        return None
    shown = "; ".join(
        f"TP group {h['group']} crosses supernodes on {', '.join(h['links'])}: "
        f"{h['bytes_across']:.4g} bytes taking {h['seconds_across']:.4g} s, "
        + (
            "every one of its links across"
            if h["per_byte_ratio"] is None
            else f"{h['per_byte_ratio']:.1f}x as long per byte as its links inside a supernode"
        )
        for h in hot
    )
    return Cause(
        "placement",
        [h["group"] for h in hot],
        f"{shown}, over {steps} step(s); every link runs at its rated speed: place each TP "
        "group inside one supernode (a topology-aware scheduler, or tp dividing npus_per_supernode)",
        {"groups": hot},
    )


def _seconds_per_byte(links: Totals) -> float:
    nbytes = sum(v[0] for v in links.values())
    return sum(v[1] for v in links.values()) / nbytes if nbytes > 0 else 0.0


#: A rank doing this many times the median rank's FLOPs of a step, on average over its steps, holds
#: its peers up. Higher than a slowdown's threshold: a balanced router's token counts vary from step to
#: step around the mean.
IMBALANCE = 1.5


def rank_work(steps: Sequence[dict[str, Any]]) -> dict[int, list[float]]:
    """Per rank: its FLOPs over each step's median summed, steps, FLOPs, compute seconds and
    collective waits summed (a step's median, so that ranks that joined or left for some steps
    compare only where they trained). The straggler test reads its compute rate from it too."""
    out: dict[int, list[float]] = {}
    for e in steps:
        ranks, flops = step_ranks(e), [float(f) for f in e["flops"]]
        busy = [f for f in flops if f > 0]  # a rank that computed nothing is no yardstick
        typical = median(busy) if busy else 0.0
        for i, r in enumerate(ranks):
            acc = out.setdefault(r, [0.0] * 5)
            acc[0] += flops[i] / typical if typical > 0 else 1.0
            acc[1] += 1
            acc[2] += flops[i]
            acc[3] += float(e["compute_s"][i])
            acc[4] += float(e["comm_wait_s"][i]) if "comm_wait_s" in e else 0.0
    return out


def imbalance(work: dict[int, list[float]], steps: int) -> Cause | None:
    """The ranks that computed, on average over their ``steps``, more than :data:`IMBALANCE` times
    the step's median rank's FLOPs while the others waited longer in their collectives than they
    did (``work``: :func:`rank_work`), or None (a skew no one waits for holds nothing up)."""
    ratio = {r: w[0] / w[1] for r, w in work.items() if w[1]}
    hot = sorted(r for r, x in ratio.items() if x > IMBALANCE)
    others = [r for r in work if r not in hot]
    if not hot or not others:
        return None
    waited = median(work[r][4] for r in others) - median(work[r][4] for r in hot)
    if waited <= 0:
        return None
    typical_s = median(work[r][3] for r in others)
    shown = listed(
        [
            f"rank {r} computes {ratio[r]:.1f}x the median rank's FLOPs ({work[r][2]:.4g} in all; "
            f"{work[r][3]:.4g} s of compute against the others' {typical_s:.4g} s)"
            for r in hot
        ]
    )
    return Cause(
        "imbalance",
        hot,
        f"work skewed onto {'one rank' if len(hot) == 1 else f'{len(hot)} ranks'} over {steps} step(s): "
        f"{shown}; the others waited {waited:.4g} s more in their collectives; every rank computes at "
        "the same rate and every link at its rated speed: balance the work (a load-balancing loss or "
        "bias on the router, a capacity limit per expert, an even pipeline split)",
        {"flops_ratio": {str(r): round(ratio[r], 3) for r in hot}, "others_waited_s": waited},
    )
