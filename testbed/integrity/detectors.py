"""The integrity detectors, as pure functions of what a step left: validators and the replica hash.

- :func:`validate`: a loss or a rank's local gradient norm that is not finite,
  or more than ``spike_factor`` times the median of its last ``window``
  healthy values (Megatron's rule is ten times); and, with three or more
  data-parallel replicas, a rank's gradient norm more than ``spike_factor``
  times the median of its replicas' at the same step (which needs no
  history: the first steps are covered too). A rank whose own gradient norm
  tripped is attributed; a loss that tripped alone attributes no one.
- :func:`vote`: each rank's parameter digest against the other data-parallel
  replicas of its shard (the ranks that share its tensor, pipeline and expert
  coordinates). With three or more replicas the majority says who is wrong;
  with two, a mismatch says only that one of them is.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

from testbed.scenario.integrity_section import ValidatorPolicy
from testbed.topology.layout import Layout

#: a spike needs at least this many healthy values before it to compare with
MIN_HISTORY = 2
#: replicas of a rank (itself included) needed to compare its gradient norm with theirs
MIN_PEERS = 3


@dataclass(frozen=True)
class Alarm:
    """One detector found a step suspect: which, whom it attributes (empty: it cannot tell), why."""

    detector: str
    ranks: tuple[int, ...]
    reason: str


def _tripped(value: float, reference: list[float], policy: ValidatorPolicy, against: str) -> str:
    """Why ``value`` trips a validator against the ``reference`` values ("" when it does not)."""
    if not math.isfinite(value):
        return f"{value}"
    if len(reference) < MIN_HISTORY:
        return ""
    median = statistics.median(reference)
    if median > 0 and value > policy.spike_factor * median:
        return f"{value:.4g}, {value / median:.3g}x the median {median:.4g} of {against}"
    return ""


def _peers(norms: dict[int, float], layout: Layout | None) -> dict[int, list[float]]:
    """Each rank's replicas' gradient norms at this step, where it has two or more replicas."""
    if layout is None:
        return {}
    out = {}
    for group in replica_groups(list(norms), layout):
        if len(group) >= MIN_PEERS:
            for rank in group:
                out[rank] = [norms[r] for r in group if r != rank]
    return out


def validate(
    loss: float,
    norms: dict[int, float],
    losses: list[float],
    history: dict[int, list[float]],
    policy: ValidatorPolicy,
    layout: Layout | None = None,
) -> Alarm | None:
    """The validators' alarm for one step (None: healthy), from its loss and each rank's local
    gradient norm, against the healthy values before it (and, given ``layout``, its replicas')."""
    reasons, ranks = [], []
    peers = _peers(norms, layout)
    for rank in sorted(norms):
        recent = history.get(rank, [])[-policy.window :]
        why = _tripped(norms[rank], recent, policy, f"the last {len(recent)} steps")
        if not why and rank in peers:
            why = _tripped(norms[rank], peers[rank], policy, f"its {len(peers[rank])} replicas' at this step")
        if why:
            ranks.append(rank)
            reasons.append(f"rank {rank}'s gradient norm is {why}")
    recent_losses = losses[-policy.window :]
    why = _tripped(loss, recent_losses, policy, f"the last {len(recent_losses)} steps")
    if why:
        reasons.append(f"the loss is {why}")
    if not reasons:
        return None
    return Alarm("validator", tuple(ranks), "; ".join(reasons))


def replica_groups(ranks: list[int], layout: Layout) -> list[list[int]]:
    """The ranks that hold the same shard of the parameters (one per data-parallel replica)."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for rank in sorted(ranks):
        c = layout.coords(rank)
        groups.setdefault((c.tp, c.pp, c.ep), []).append(rank)
    return [g for _, g in sorted(groups.items()) if len(g) > 1]


def vote(digests: dict[int, str], layout: Layout) -> Alarm | None:
    """The hash's alarm (None: every replica agrees): the ranks outvoted by a strict majority of their
    replicas are attributed; a group with no majority attributes no one."""
    outvoted: list[int] = []
    split: list[list[int]] = []
    for group in replica_groups(list(digests), layout):
        counts = Counter(digests[r] for r in group)
        if len(counts) == 1:
            continue
        top, n = counts.most_common(1)[0]
        if 2 * n > len(group):
            outvoted.extend(r for r in group if digests[r] != top)
        else:
            split.append(group)
    if not outvoted and not split:
        return None
    parts = [f"ranks {outvoted} differ from the majority of their replicas"] if outvoted else []
    parts += [f"replicas {g} disagree with no majority: which is right cannot be told" for g in split]
    return Alarm("parameter_hash", tuple(sorted(outvoted)), "; ".join(parts))
