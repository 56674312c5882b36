"""The integrity detectors, as pure functions of what a step left: validators and the replica hash.

- :func:`validate`: a loss or a rank's local gradient norm that is not finite,
  or more than ``spike_factor`` times the median of its last ``window``
  healthy values (Megatron's rule is ten times). A rank whose own gradient
  norm tripped is attributed; a loss that tripped alone attributes no one.
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

from testbed.scenario.model import ValidatorPolicy
from testbed.topology.layout import Layout

#: a spike needs at least this many healthy values before it to compare with
MIN_HISTORY = 2


@dataclass(frozen=True)
class Alarm:
    """One detector found a step suspect: which, whom it attributes (empty: it cannot tell), why."""

    detector: str
    ranks: tuple[int, ...]
    reason: str


def _tripped(value: float, history: list[float], policy: ValidatorPolicy) -> str:
    """Why ``value`` trips a validator ("" when it does not)."""
    if not math.isfinite(value):
        return f"{value}"
    recent = history[-policy.window :]
    if len(recent) < MIN_HISTORY:
        return ""
    median = statistics.median(recent)
    if median > 0 and value > policy.spike_factor * median:
        return f"{value:.4g}, {value / median:.3g}x the median {median:.4g} of the last {len(recent)} steps"
    return ""


def validate(
    loss: float,
    norms: dict[int, float],
    losses: list[float],
    history: dict[int, list[float]],
    policy: ValidatorPolicy,
) -> Alarm | None:
    """The validators' alarm for one step (None: healthy), from its loss and each rank's local
    gradient norm, against the healthy values before it."""
    reasons, ranks = [], []
    for rank in sorted(norms):
        why = _tripped(norms[rank], history.get(rank, []), policy)
        if why:
            ranks.append(rank)
            reasons.append(f"rank {rank}'s gradient norm is {why}")
    why = _tripped(loss, losses, policy)
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
