"""How a journal records the links a step used, and reading them back.

A ``step_end`` of a world of up to 64 ranks carries ``links``: per receiver
and sender, [bytes, seconds on the link, rated seconds, receiver's wait,
rated latency seconds] and, once any of its messages queued at the receiver's ingress behind
other senders' bytes, the seconds queued. A larger world's step carries its ``ranks`` and a
summary; its links, added up over the phase, are one ``link_totals`` event
(``"src->dst": [...]``) at the phase's end. The hotspot diagnosis and the
fault effects read either through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Events = Sequence[dict[str, Any]]


def step_ranks(step: dict[str, Any]) -> list[int]:
    """The ranks that trained a journalled step, in the order of its per-rank lists."""
    if "links" in step:
        return sorted(int(r) for r in step["links"])
    return [int(r) for r in step.get("ranks", [])]


def add_observation(
    totals: dict[tuple[int, int], list[float]], link: tuple[int, int], obs: list[float]
) -> None:
    """Add one record of ``link`` to ``totals`` (five figures, or six with the seconds queued)."""
    acc = totals.setdefault(link, [0.0] * 5)
    if len(obs) > len(acc):
        acc.extend([0.0] * (len(obs) - len(acc)))
    for i, x in enumerate(obs):
        acc[i] += float(x)


def queued_s(obs: list[float]) -> float:
    """Seconds a link's messages queued at the receiver's ingress (0 when none did)."""
    return float(obs[5]) if len(obs) > 5 else 0.0


def link_totals(
    steps: list[dict[str, Any]], events: Events = (), phase: str = "main"
) -> dict[tuple[int, int], list[float]]:
    """Per directed link (sender, receiver): [bytes, seconds on the link, rated seconds, receiver's wait,
    rated latency seconds(, seconds queued)] over the steps (from the phase's ``link_totals`` when
    steps carry none)."""
    totals: dict[tuple[int, int], list[float]] = {}
    for e in events:
        if e.get("event") == "link_totals" and e.get("phase") == phase:
            for key, obs in e["links"].items():
                src, dst = key.split("->")
                totals[(int(src), int(dst))] = [float(x) for x in obs]
    for e in steps:
        if "links" not in e:
            continue
        for dst, by_src in e["links"].items():
            for src, obs in by_src.items():
                add_observation(totals, (int(src), int(dst)), obs)
    return totals
